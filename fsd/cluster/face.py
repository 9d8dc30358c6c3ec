"""N replicas behind the engine's one face: the daemon serves them as it serves one.

Design. `ReplicaSetFace` has `EngineFace`'s surface (fsd.engine.face), so the server
is the same code for one replica or many. A request is admitted here, once
(`fsd.admission.admit`: tokenized and checked under limits every replica allows),
named here (job ids are the daemon's, unique across replicas), placed by the router
and queued on its replica as admitted (the replica's engine trusts it) without
waiting for it: the client hears Accepted at once. `step` collects what the replicas produced since
the last look (they step on their own, in parallel). Status, job lists and telemetry
read the views replicas push, and an abort is told, answered at once from what the
job made so far (`fsd.cluster.pushed`); a verb that needs an answer (retune, a move,
the preview's history) waits at most one step of the replicas it asks, within a
deadline (`fsd.cluster.handles`: a replica that hangs is replaced).

A replica that dies loses nothing silently (fsd.cluster.placement): its jobs that had
not started are placed on another replica, its started ones end with the error; the
router stops choosing it until its fresh copy is up, and the snapshot says it is down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Sequence, Set
from typing import Any, Protocol

from fsd.admission import JobRequest, RequestLimits, admit, strictest
from fsd.cluster.handles import Replicas
from fsd.cluster.merge import merge_snapshots, replica_infos
from fsd.cluster.moves import Moves
from fsd.cluster.placement import Placement
from fsd.cluster.pushed import Progress, Views
from fsd.cluster.worker import ReplicaDown, Report
from fsd.config import EngineConfig
from fsd.engine.events import MAX_EVENTS, EngineEvent
from fsd.engine.output import RequestOutput, StepDelta
from fsd.engine.views import Admitted, EngineSnapshot, Stepped
from fsd.errors import FsdError, SettingError, UnknownJobError
from fsd.protocol_telemetry import JobInfo, RouteInfo
from fsd.sched.retune import RETUNABLE, plan_retune
from fsd.tokenizer import Tokenizer

STEP_WAIT = 0.005  # seconds a step waits for news from the replicas
ROUTES_KEPT = 64  # the router's latest decisions, for the console
_job_ids = itertools.count(1)


class Chooser(Protocol):
    """Picks each request's replica (fsd.router's routers are ones)."""

    def choose(
        self, job_id: str, prompt: Sequence[int], affinity: str | None, avoid: Set[int]
    ) -> tuple[int, str]:
        """(the replica's index, why) for a job with these prompt tokens and key; never
        one in `avoid` (down or draining) while another is left."""
        ...

    def observe(self, index: int, report: Report) -> None:
        """A replica's latest report (its state for the router; `down` if it is gone)."""
        ...


class ReplicaError(FsdError):
    """A replica failed at something (its text says what)."""

    code = "internal"


class ReplicaSetFace:
    """N replicas as the daemon sees one engine (module doc)."""

    def __init__(self, replicas: Replicas, chooser: Chooser, tokenizer: Tokenizer) -> None:
        fixed = replicas.fixed()
        self.replicas = replicas
        self.chooser = chooser
        self.info = fixed[0].info
        # what a request is admitted under: what every replica allows (they may be
        # retuned apart); each replica's own, as of its latest retune
        self._limits = {i: f.limits for i, f in enumerate(fixed)}
        self.limits: RequestLimits = strictest(list(self._limits.values()))
        self.config: EngineConfig = fixed[0].config  # the first replica's live one
        self.replica_configs = [f.config for f in fixed]  # each one's (retunes may differ)
        self.tokenizer = tokenizer
        self.replica_count = len(replicas)
        self.jobs_at = Placement()
        self.moves = Moves(replicas, self.jobs_at)
        self._held: list[Report] = []  # reports read early (a move): handled first next step
        self._busy = [False] * len(replicas)
        self._lost: set[int] = set()  # replicas whose death was handled (until revived)
        # the replicas' events until drained (the daemon does; the offline API never):
        # the latest MAX_EVENTS at most
        self._events: deque[EngineEvent] = deque(maxlen=MAX_EVENTS)
        self.decisions: list[tuple[float, str, int, str]] = []  # (time, job, replica, why)
        self.views = Views()  # what each replica pushed
        self.progress = Progress()  # what each live job made (an abort's answer)

    # ---- the jobs ------------------------------------------------------------------------

    def live(self) -> int:
        return len(self.jobs_at.owner)

    def busy(self) -> bool:
        return bool(self.jobs_at.owner) or any(self._busy)

    def jobs(self, now: float | None = None) -> list[JobInfo]:
        return self.views.jobs(self._viewed())

    def has(self, job_id: str) -> bool:
        return job_id in self.jobs_at.owner

    def job(self, job_id: str, now: float | None = None) -> JobInfo | None:
        index = self.jobs_at.owner.get(job_id)
        if index is None:
            return None
        row = self.views.job(job_id)  # else too new for a view: asked (a deadline holds)
        return row if row is not None else self.replicas.call(index, "job", job_id, now)

    def replica_of(self, job_id: str) -> int | None:
        """The replica a live job runs on."""
        return self.jobs_at.owner.get(job_id)

    def snapshot(
        self, now: float | None = None, with_jobs: bool = True, detail: bool = True
    ) -> EngineSnapshot:
        """The replicas' snapshots as one, with each replica's own line (a replica that
        is down says why) and the router's recent decisions."""
        now = time.time() if now is None else now
        parts = self.views.snapshots(self._viewed(), with_jobs, detail)
        if not parts:
            raise ReplicaError("every replica is down: " + "; ".join(self.replicas.down.values()))
        merged = merge_snapshots(list(parts.values()))
        down = [f"replica {i} down: {why}" for i, why in sorted(self.replicas.down.items())]
        return dataclasses.replace(
            merged,
            degraded="; ".join(filter(None, [merged.degraded, *down])) or None,
            replicas=replica_infos(parts, self.replicas.down, self.moves.draining),
            routes=[RouteInfo(time=t, job_id=j, replica=r, why=w) for t, j, r, w in self.decisions],
        )

    def level_counts(self) -> dict[int, tuple[int, int]]:
        """Per level with jobs, over the replicas: how many run and how many wait."""
        return self.views.level_counts(self._viewed())

    def _viewed(self) -> list[int]:
        """The replicas that are up, each with a view (one just started is asked for
        its first: a deadline holds)."""
        up = self.replicas.up()
        for i, view in self.replicas.call_all_of([i for i in up if i not in self.views.latest], "view").items():
            self.views.update(i, view)
        return [i for i in up if i in self.views.latest]

    def history(self, slo: float) -> list[Any]:
        """Each replica's scheduler with its step history (fsd.twin): the preview runs
        them forward side by side."""
        snaps = self.replicas.call_all("history", slo)
        if not snaps:
            raise ReplicaError("every replica is down: nothing to preview")
        return list(snaps.values())

    def drain_events(self) -> list[EngineEvent]:
        events = list(self._events)
        self._events.clear()
        return events

    # ---- the verbs -------------------------------------------------------------------

    def admit(self, request: JobRequest) -> Admitted:
        """Admit, name and place one request (module doc); FsdError if refused."""
        r = admit(request, self.limits, self.tokenizer, self.info.vocab_size)
        job_id = r.job_id or f"job-r{next(_job_ids)}"
        if job_id in self.jobs_at.owner:
            raise FsdError(f"request id {job_id!r} is already in use")
        arrival = time.time() if r.arrival is None else r.arrival
        # held until it starts (a replica's death places it again): its ids, not its text
        placed = dataclasses.replace(r, prompt=r.ids, job_id=job_id, arrival=arrival, tags=tuple(r.tags))
        self._place(job_id, placed)
        return Admitted(job_id, len(r.ids))

    def abort(self, job_id: str) -> RequestOutput:
        index = self.jobs_at.owner.get(job_id)
        if index is None:
            raise UnknownJobError(f"no job with id {job_id!r}")
        with contextlib.suppress(ReplicaDown):  # a replica gone took the job with it
            self.replicas.tell(index, "abort", job_id)
        self.jobs_at.finished(job_id)
        return self.progress.aborted(job_id)

    def retune(self, replica: int | None = None, /, **changes: Any) -> EngineConfig:
        """Every replica that is up, or `replica` alone; checked here first, so all
        take it or none does. Returns the (first) replica's new config."""
        if replica is None:
            targets = self.replicas.up()
        elif 0 <= replica < len(self.replicas) and replica not in self.replicas.down:
            targets = [replica]
        else:
            raise SettingError(f"no replica {replica} is up (replicas: {self.replicas.up()})")
        for i in targets:
            live = self.replica_configs[i]
            plan_retune(live.sched, live.cache, changes)  # SettingError: none changed
        for i in targets:
            self.replica_configs[i] = self.replicas.call(i, "retune", changes)
            self._limits[i] = self.replicas.call(i, "fixed").limits
        self.limits = strictest(list(self._limits.values()))
        self.config = self.replica_configs[targets[0] if replica is not None else self._first_up()]
        return self.config

    def _first_up(self) -> int:
        up = self.replicas.up()
        return up[0] if up else 0

    def step(self) -> Stepped:
        """What every replica produced since the last step (waits briefly for news)."""
        t0 = time.perf_counter()
        for i in self.replicas.revived():
            self._lost.discard(i)
            self.views.forget(i)
            self._catch_up(i)
            self.chooser.observe(i, Report(i))
        deltas: list[StepDelta] = []
        failures: list[tuple[str, Exception]] = []
        iterations = []
        reports, self._held = [*self._held, *self.replicas.poll(STEP_WAIT)], []
        for report in reports:
            self._busy[report.index] = report.busy
            self.chooser.observe(report.index, report)
            if report.view is not None:
                self.views.update(report.index, report.view)
            if report.down and report.index not in self._lost:
                deltas.extend(self._lose(report.index, report.down))
            # a job aborted here may still have tokens in flight from its replica: dropped
            owned = self.jobs_at.owner
            deltas.extend(d for d in report.deltas if d.job_id in owned)
            deltas.extend(
                _ended(r.job_id, f"{r.code}: {r.message}") for r in report.refused if r.job_id in owned
            )
            iterations.extend(report.iterations)
            self._events.extend(report.events)
            failures += [(f"replica {report.index}", ReplicaError(f)) for f in report.failures]
        for d in deltas:
            (self.jobs_at.finished if d.finished else self.jobs_at.started)(d.job_id)
            self.progress.saw(d)
        if self.moves.rebalance():
            self._hold()
        return Stepped(deltas, iterations, time.perf_counter() - t0, failures)

    # ---- moving jobs (fsd.cluster.moves) ---------------------------------------------

    def move(self, job_id: str, to: int) -> None:
        """Move a job that can move to replica `to` (CannotMove: it stays)."""
        if job_id not in self.jobs_at.owner:
            raise UnknownJobError(f"no job with id {job_id!r}")
        self.moves.move(job_id, to)
        self._hold()

    def drain_replica(self, index: int) -> dict[str, int]:
        """New jobs go elsewhere and this replica's jobs move off as they can."""
        moved, staying = self.moves.drain(index)
        self._hold()
        return {"replica": index, "moved": moved, "staying": staying}

    def undrain_replica(self, index: int) -> dict[str, int]:
        self.moves.undrain(index)
        return {"replica": index}

    def _hold(self) -> None:
        """Read what the replicas made before a move, so a moved job's earlier tokens
        go out before the ones it makes on its new replica."""
        self._held.extend(self.replicas.poll(0.0))

    def close(self) -> None:
        self.replicas.close()

    def _catch_up(self, index: int) -> None:
        """A fresh replica starts from the daemon's first config: retune it to its own
        live one."""
        first, live = self.replicas.configs[index], self.replica_configs[index]
        changes = {
            name: getattr(getattr(live, part), name)
            for part in ("sched", "cache")
            for name in RETUNABLE
            if hasattr(getattr(live, part), name)
            and getattr(getattr(live, part), name) != getattr(getattr(first, part), name)
        }
        if changes:
            self.replicas.call(index, "retune", changes)

    # ---- placing jobs ----------------------------------------------------------------

    def _place(self, job_id: str, request: JobRequest) -> None:
        """Send a job to the router's replica, or to another one that is up."""
        targets = self.moves.targets()
        avoid = {i for i in range(len(self.replicas)) if i not in targets}
        index, why = self.chooser.choose(job_id, request.ids, request.affinity, avoid)
        tried: set[int] = set()
        while True:
            if index in self.moves.targets():
                try:
                    self.replicas.admit(index, request)
                    break
                except ReplicaDown:
                    pass
            tried.add(index)
            left = [i for i in self.moves.targets() if i not in tried]
            if not left:
                raise ReplicaError("no replica is up: " + "; ".join(self.replicas.down.values()))
            index = min(left, key=self.jobs_at.count)
            why = f"replica {min(tried)} is down or draining: the least-loaded one that is up"
        self.jobs_at.place(job_id, index, request)
        self.progress.placed(job_id, request.arrival or 0.0)
        self.decisions = [*self.decisions[1 - ROUTES_KEPT :], (time.time(), job_id, index, why)]

    def _lose(self, index: int, why: str) -> list[StepDelta]:
        """A replica died: its waiting jobs go elsewhere, its started ones end."""
        self._lost.add(index)
        self.views.forget(index)
        again, ended = self.jobs_at.lost(index)
        out = [
            _ended(j, f"replica {index} failed ({why}); the job had started there and its KV was lost")
            for j in ended
        ]
        for job_id, request in again:
            try:
                self._place(job_id, request)
            except ReplicaError as exc:
                out.append(_ended(job_id, str(exc)))
        return out


def _ended(job_id: str, error: str) -> StepDelta:
    """A job that ends here, with `error` (refused by its replica, or lost with it)."""
    now = time.time()
    return StepDelta(job_id, (), "", output=RequestOutput(
        request_id=job_id, prompt=None, prompt_token_ids=[], text="", token_ids=[],
        finish_reason="error", arrival_time=now, first_token_time=None, finish_time=now,
        error=error,
    ))  # fmt: skip


class LeastLive:
    """The fallback router: the replica with the fewest live jobs, counting the ones
    sent since its last report (optimistic accounting); never one that is down."""

    def __init__(self, n: int) -> None:
        self.live = [0.0] * n
        self.sent = [0] * n

    def choose(
        self, job_id: str, prompt: Sequence[int], affinity: str | None, avoid: Set[int]
    ) -> tuple[int, str]:
        load = [a + b for a, b in zip(self.live, self.sent, strict=True)]
        index = min((i for i in range(len(load)) if i not in avoid), key=load.__getitem__, default=0)
        self.sent[index] += 1
        return index, f"least live jobs ({load[index]:g})"

    def observe(self, index: int, report: Report) -> None:
        self.live[index] = float("inf") if report.down else report.live
        self.sent[index] = 0
