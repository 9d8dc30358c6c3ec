"""N replicas behind the engine's one face: the daemon serves them as it serves one.

Design. `ReplicaSetFace` has `EngineFace`'s surface (fsd.engine.face), so the server
is the same code for one replica or many. An admission is checked here by the engine's
own rules (`prompt_ids`, `check_stop_ids`, `check_request`: every replica has the
same model and limits), named here (job ids are the daemon's, unique across
replicas), placed by the router and queued on its replica without waiting for it:
the client hears Accepted at once. `step` collects what the replicas produced since
the last look (they step on their own, in parallel); a verb that needs an answer
(abort, retune, the job table) waits at most one step of the replicas it asks.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import Any, Protocol

from fsd.cluster.handles import Replicas
from fsd.cluster.merge import merge_snapshots, replica_infos
from fsd.cluster.worker import Report
from fsd.config import EngineConfig
from fsd.engine.events import EngineEvent
from fsd.engine.output import RequestOutput, StepDelta
from fsd.engine.prompts import check_stop_ids, prompt_ids
from fsd.engine.views import Admitted, EngineSnapshot, JobRequest, Stepped
from fsd.errors import FsdError, UnknownJobError
from fsd.protocol_telemetry import JobInfo, RouteInfo
from fsd.sched.admission import RequestLimits, check_request
from fsd.sched.retune import plan_retune
from fsd.tokenizer import Tokenizer

STEP_WAIT = 0.005  # seconds a step waits for news from the replicas
_job_ids = itertools.count(1)


class Chooser(Protocol):
    """Picks each request's replica (fsd.router's routers are ones)."""

    def choose(self, prompt: Sequence[int], session: str | None) -> tuple[int, str]:
        """(the replica's index, why) for a request with these prompt tokens."""
        ...

    def observe(self, index: int, report: Report) -> None:
        """A replica's latest report (its state for the router, its live jobs)."""
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
        self.limits: RequestLimits = fixed[0].limits  # every replica's (one model, one config)
        self.config: EngineConfig = fixed[0].config  # the live one: a retune replaces it
        self.tokenizer = tokenizer
        self.replica_count = len(replicas)
        self._owner: dict[str, int] = {}  # every live job's replica
        self._busy = [False] * len(replicas)
        self._events: list[EngineEvent] = []
        self.decisions: list[tuple[float, str, int, str]] = []  # (time, job, replica, why)

    # ---- the jobs ------------------------------------------------------------------------

    def live(self) -> int:
        return len(self._owner)

    def busy(self) -> bool:
        return bool(self._owner) or any(self._busy)

    def jobs(self, now: float | None = None) -> list[JobInfo]:
        return [row for rows in self.replicas.call_all("jobs", now) for row in rows]

    def has(self, job_id: str) -> bool:
        return job_id in self._owner

    def job(self, job_id: str, now: float | None = None) -> JobInfo | None:
        index = self._owner.get(job_id)
        return None if index is None else self.replicas.call(index, "job", job_id, now)

    def replica_of(self, job_id: str) -> int | None:
        """The replica a live job runs on."""
        return self._owner.get(job_id)

    def snapshot(self, now: float | None = None, with_jobs: bool = True) -> EngineSnapshot:
        """The replicas' snapshots as one, with each replica's own line and the
        router's recent decisions."""
        now = time.time() if now is None else now
        parts = self.replicas.call_all("snapshot", now, with_jobs)
        routes = [RouteInfo(time=t, job_id=j, replica=r, why=w) for t, j, r, w in self.decisions]
        return dataclasses.replace(
            merge_snapshots(parts), replicas=replica_infos(parts), routes=routes
        )

    def replica_snapshots(self, now: float | None = None) -> list[EngineSnapshot]:
        """Each replica's own snapshot, without its job table."""
        return self.replicas.call_all("snapshot", time.time() if now is None else now, False)

    def history(self, slo: float) -> Any:
        raise FsdError(
            "the what-if preview replays one scheduler; with several replicas it is not "
            "available yet (run it against a one-replica daemon)"
        )

    def drain_events(self) -> list[EngineEvent]:
        events, self._events = self._events, []
        return events

    # ---- the verbs -------------------------------------------------------------------

    def admit(self, request: JobRequest) -> Admitted:
        """Check, name and place one request (module doc); FsdError if refused."""
        r = request
        check_stop_ids(r.params, self.info.vocab_size)
        ids = prompt_ids(r.prompt, self.tokenizer, self.info.vocab_size)
        check_request(len(ids), r.params.max_tokens, self.limits, r.clip)
        job_id = r.job_id or f"job-r{next(_job_ids)}"
        if job_id in self._owner:
            raise FsdError(f"request id {job_id!r} is already in use")
        index, why = self.chooser.choose(ids, r.session)
        arrival = time.time() if r.arrival is None else r.arrival
        self.replicas.admit(index, ids, r.params, job_id, arrival, r.tags)
        self._owner[job_id] = index
        self.decisions = [*self.decisions[-63:], (arrival, job_id, index, why)]
        return Admitted(job_id, len(ids))

    def abort(self, job_id: str) -> RequestOutput:
        index = self._owner.get(job_id)
        if index is None:
            raise UnknownJobError(f"no job with id {job_id!r}")
        out = self.replicas.call(index, "abort", job_id)
        self._owner.pop(job_id, None)
        return out

    def retune(self, **changes: Any) -> EngineConfig:
        """Every replica, or none: the change is checked here first."""
        plan_retune(self.config.sched, self.config.cache, changes)  # SettingError: none
        self.config = self.replicas.call_all("retune", changes)[0]
        return self.config

    def step(self) -> Stepped:
        """What every replica produced since the last step (waits briefly for news)."""
        t0 = time.perf_counter()
        reports = self.replicas.poll(STEP_WAIT)
        deltas: list[StepDelta] = []
        failures: list[tuple[str, Exception]] = []
        iterations = []
        for report in reports:
            self._busy[report.index] = report.busy
            self.chooser.observe(report.index, report)
            deltas.extend(report.deltas)
            deltas.extend(self._refused(report))
            iterations.extend(report.iterations)
            self._events.extend(report.events)
            failures += [(f"replica {report.index}", ReplicaError(f)) for f in report.failures]
        for d in deltas:
            if d.finished:
                self._owner.pop(d.job_id, None)
        return Stepped(deltas, iterations, time.perf_counter() - t0, failures)

    def _refused(self, report: Report) -> list[StepDelta]:
        """A job its replica refused ends with that error."""
        now = time.time()
        return [
            StepDelta(r.job_id, (), "", output=RequestOutput(
                request_id=r.job_id, prompt=None, prompt_token_ids=[], text="", token_ids=[],
                finish_reason="error", arrival_time=now, first_token_time=None,
                finish_time=now, error=f"{r.code}: {r.message}",
            ))
            for r in report.refused
        ]  # fmt: skip

    def close(self) -> None:
        self.replicas.close()


class LeastLive:
    """The fallback router: the replica with the fewest live jobs, counting the ones
    sent since its last report (optimistic accounting)."""

    def __init__(self, n: int) -> None:
        self.live = [0] * n
        self.sent = [0] * n

    def choose(self, prompt: Sequence[int], session: str | None) -> tuple[int, str]:
        load = [a + b for a, b in zip(self.live, self.sent, strict=True)]
        index = min(range(len(load)), key=load.__getitem__)
        self.sent[index] += 1
        return index, f"least live jobs ({load[index]})"

    def observe(self, index: int, report: Report) -> None:
        self.live[index], self.sent[index] = report.live, 0
