"""Moving jobs between replicas: by hand (`move`), off a replica being drained
(`drain`), and from a replica whose jobs wait to one that is idle (`rebalance`).

A job moves with what it needs to go on (fsd.engine.migration): one that has not run
yet moves as its request, one preempted to host memory with its KV; one that is
running stays (a drain moves it once it is preempted, or lets it finish). The
rebalancer's rule (which jobs, from where to where) is fsd.router.rebalance's, the
simulator's too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container

from fsd.cluster.handles import Replicas
from fsd.cluster.placement import Placement
from fsd.engine.migration import CannotMove
from fsd.errors import FsdError, SettingError
from fsd.router.rebalance import REBALANCE_EVERY, plan_rebalance

log = logging.getLogger("fsd.cluster")


class Moves:
    """Moves jobs between the replicas (module doc); `moved` counts the moves."""

    def __init__(self, replicas: Replicas, jobs_at: Placement) -> None:
        self.replicas = replicas
        self.jobs_at = jobs_at
        self.draining: set[int] = set()
        self.moved = 0
        self._next_look = 0.0

    def targets(self) -> list[int]:
        """The replicas that take jobs: up and not draining."""
        return [i for i in self.replicas.up() if i not in self.draining]

    def move(self, job_id: str, to: int) -> None:
        """Move one job to replica `to` (CannotMove, UnknownJobError: it stays)."""
        src = self.jobs_at.owner.get(job_id)
        if src is None or src == to:
            return
        moved = self.replicas.call(src, "take_out", job_id)
        try:
            self.replicas.call(to, "bring_in", moved)
        except BaseException:
            self.replicas.call(src, "bring_in", moved)  # back where it was
            raise
        self.jobs_at.owner[job_id] = to
        if moved.job.output_token_ids:
            self.jobs_at.started(job_id)
        self.moved += 1

    def drain(self, index: int) -> tuple[int, int]:
        """Take no new jobs on `index` and move its jobs off: (moved, staying)."""
        self._check(index)
        self.draining.add(index)
        log.info("replica %d drains: its jobs move to the others", index)
        return self._move_off(index)

    def undrain(self, index: int) -> None:
        self._check(index)
        self.draining.discard(index)
        log.info("replica %d takes jobs again", index)

    def rebalance(self, now: float | None = None) -> int:
        """Jobs still on draining replicas move once they can; an idle replica takes
        waiting jobs from the busiest one. The jobs moved."""
        now = time.monotonic() if now is None else now
        if now < self._next_look:
            return 0
        self._next_look = now + REBALANCE_EVERY
        moved = sum(self._move_off(i)[0] for i in sorted(self.draining) if self.jobs_at.count(i))
        by_replica: dict[int, list[str]] = {}
        for job_id, i in self.jobs_at.owner.items():
            by_replica.setdefault(i, []).append(job_id)
        started = _Started(self.jobs_at.pending)
        plan = plan_rebalance(by_replica, started, self.targets())
        if plan is None:
            return moved
        left = plan.count
        for job_id in plan.candidates:
            if left <= 0:
                break
            ok = self._try(job_id, plan.target)
            moved, left = moved + ok, left - ok
        if left < plan.count:
            log.info(
                "rebalanced: %d waiting jobs from replica %d to idle replica %d",
                plan.count - left, plan.source, plan.target,
            )  # fmt: skip
        return moved

    # ---- helpers -----------------------------------------------------------------------

    def _check(self, index: int) -> None:
        if not 0 <= index < len(self.replicas):
            raise SettingError(f"no replica {index} (replicas: 0..{len(self.replicas) - 1})")

    def _move_off(self, index: int) -> tuple[int, int]:
        moved = staying = 0
        for job_id in self._movable_first(index):
            dest = [i for i in self.targets() if i != index]
            if not dest:
                staying += 1
                continue
            ok = self._try(job_id, min(dest, key=self.jobs_at.count))
            moved, staying = moved + ok, staying + (1 - ok)
        return moved, staying

    def _movable_first(self, index: int) -> list[str]:
        """`index`'s jobs, the ones that have not started first."""
        jobs = [j for j, i in self.jobs_at.owner.items() if i == index]
        return sorted(jobs, key=lambda j: j not in self.jobs_at.pending)

    def _try(self, job_id: str, to: int) -> int:
        try:
            self.move(job_id, to)
        except (CannotMove, FsdError):  # running now, or gone: it stays for now
            return 0
        return 1


class _Started:
    """The jobs that have started: those not waiting with their request (`pending`)."""

    def __init__(self, pending: Container[str]) -> None:
        self.pending = pending

    def __contains__(self, job_id: object) -> bool:
        return job_id not in self.pending
