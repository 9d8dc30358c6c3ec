"""Making device room for a job by evicting lower-priority jobs' KV.

Victims are device-resident jobs below the job in priority, lowest first, never in
the batch or in flight. The KV policy decides whether the job may evict at all,
whether a victim's KV may be dropped (recomputed later) and whether it swaps to the
host. The eviction is planned before any victim is touched, so nothing is evicted
for a job that still would not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fsd.jobs import Job, KVLocation
from fsd.kv.block_manager import BlockManager
from fsd.kv.policies import KVPolicy

if TYPE_CHECKING:
    from fsd.sched.decision import SchedulerOutput


class Evictor:
    """Frees device blocks for a job, as the KV policy allows."""

    def __init__(self, blocks: BlockManager) -> None:
        self.blocks = blocks
        self._victims: list[tuple[tuple, Job]] = []
        self._victims_for: SchedulerOutput | None = None

    def make_room(
        self,
        job: Job,
        need: int,
        policy: KVPolicy,
        key: Callable[[Job], tuple],
        protected: set[str],
        evicted: set[str],
        out: SchedulerOutput,
        dry: bool = False,
    ) -> bool:
        """Evict lower jobs until `need` device blocks are free; False (nothing evicted)
        if they cannot be (`dry`: only whether they could, nothing evicted)."""
        if need <= self.blocks.num_free:
            return True
        plan = self._plan(job, need, policy, key, protected, out)
        if plan is None or dry:
            return plan is not None
        for victim, swap in plan:
            evicted.add(victim.job_id)
            if swap:
                out.record(self.blocks.swap_out(victim, sync=True))
            else:
                self._drop(victim, out)
        return need <= self.blocks.num_free

    def _plan(
        self, job: Job, need: int, policy: KVPolicy, key: Callable[[Job], tuple],
        protected: set[str], out: SchedulerOutput,
    ) -> list[tuple[Job, bool]] | None:  # fmt: skip
        """The lower jobs to evict, lowest first, and whether each is swapped rather
        than dropped; None if they cannot free `need` blocks."""
        blocks = self.blocks
        if not policy.may_evict_for(job):
            return None
        rank = key(job)
        victims = [
            v
            for k, v in self._victim_order(key, out)
            if k > rank and v.block_table and v is not job and v.job_id not in protected
        ]
        may_drop = policy.may_drop_for(job)
        plan: list[tuple[Job, bool]] = []  # (victim, swap it rather than drop it)
        free, host_free = blocks.num_free, blocks.host.num_free
        for victim in victims:
            if free >= need:
                break
            n = len(victim.block_table)  # host blocks a swap takes at most
            swap = policy.swaps and n <= host_free
            if not swap and not may_drop:
                continue
            plan.append((victim, swap))
            host_free -= n if swap else 0
            free += blocks.freed_by(victim)  # its shared blocks stay
        return plan if free >= need else None

    def _victim_order(
        self, key: Callable[[Job], tuple], out: SchedulerOutput
    ) -> list[tuple[tuple, Job]]:
        """Device-resident jobs, lowest priority first, sorted once per iteration.

        Keys do not change within an iteration; jobs that left the device since are
        skipped (empty block table or no longer DEVICE).
        """
        if self._victims_for is not out:
            self._victims = sorted(
                ((key(v), v) for v in self.blocks.on_device.values()),  # type: ignore[arg-type]
                key=lambda kv: kv[0],
                reverse=True,
            )
            self._victims_for = out
        return [(k, v) for k, v in self._victims if v.kv is KVLocation.DEVICE]

    def _drop(self, job: Job, out: SchedulerOutput) -> None:
        """Preempt by recomputation: the job's KV is gone; it re-prefills later."""
        self.blocks.free(job)
        job.num_computed_tokens = 0
        job.recomputes += 1
        out.recomputed.append(job)
