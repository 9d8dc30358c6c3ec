"""The engine's one narrow face: everything the daemon does with an engine.

Design. The daemon (fsd.server) reaches the engine through `EngineFace` alone: the
jobs and one job (`jobs`, `job`), a snapshot of the scheduler, KV pools, prefix cache
and recent iterations (`snapshot`), the scheduler with its step history for the
what-if twin (`history`), and the verbs `admit`, `abort`, `retune`, `step`; with the
bookkeeping a loop needs (`info`, `config`, `limits`, `live`, `busy`,
`drain_events`, `close`). Every call takes and returns plain values (fsd.engine.views,
`RequestOutput`, `EngineConfig`, the twin's pickled snapshot), never a live `Job` or
scheduler, so the same face can stand for a replica in another process. The one
exception is `tokenizer`: the in-process HTTP frontend tokenizes chat prompts itself.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from fsd.admission import JobRequest, RequestLimits
from fsd.config import EngineConfig
from fsd.cost import CostModel
from fsd.engine.core import Engine
from fsd.engine.events import EngineEvent
from fsd.engine.migration import MovedJob, bring_in, take_out
from fsd.engine.output import RequestOutput
from fsd.engine.views import Admitted, EngineInfo, EngineSnapshot, Stepped, SwapBytes, job_info
from fsd.errors import SettingError
from fsd.jobs import JobStatus
from fsd.protocol_telemetry import JobInfo
from fsd.sched.slo import default_slo
from fsd.tokenizer import Tokenizer

RECENT_ITERATIONS = 64  # iterations a snapshot carries
# (scheduler, step history, sched config, cache config, slo) -> the what-if twin's
# snapshot: given by whoever builds the face (fsd.twin.snapshot.take_snapshot), so the
# engine does not import the twin that reads it
Snapshotter = Callable[..., Any]


class EngineFace:
    """One engine as the daemon sees it (module doc); wraps an `Engine` in process."""

    replica_count = 1  # engine replicas behind this face (fsd.cluster's face has several)

    def __init__(
        self, engine: Engine, events: bool | None = None, snapshot: Snapshotter | None = None
    ) -> None:
        """`events`: keep the engine's events for `drain_events` (the daemon does);
        None leaves the engine's setting as it is. `snapshot`: how `history` freezes the
        scheduler for the what-if twin (None: no previews here)."""
        self._engine = engine
        self._snapshot = snapshot
        if events is not None:
            engine.events.enabled = events
        blocks = engine.blocks
        self.info = EngineInfo(
            source=engine.loaded.source,
            model=engine.config.model.model,
            max_model_len=engine.max_model_len,
            vocab_size=engine.loaded.arch.vocab_size,
            kv_tokens=blocks.device.num_blocks * blocks.block_size,
            slo=default_slo(engine.cost),
        )
        self.cost: CostModel = engine.cost  # service is charged in it (a router prices with it)
        # the model's tokenizer (in process only: the HTTP frontend's chat prompts)
        self.tokenizer: Tokenizer = engine.tokenizer
        # the job rows and queue ranks of one engine state (`jobs`)
        self._rows: tuple[tuple[int, int, int], list[JobInfo]] | None = None
        self._rank_cache: tuple[tuple[int, int, int], dict[str, int]] | None = None

    # ---- settings and bounds ---------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        """The live configuration (a frozen value; `retune` replaces it)."""
        return self._engine.config

    @property
    def limits(self) -> RequestLimits:
        """What bounds one request here now (fsd.admission)."""
        return self._engine.limits

    # ---- the jobs ----------------------------------------------------------------

    def live(self) -> int:
        """How many jobs the scheduler holds (cheap: the job caps read it per submit)."""
        return len(self._engine.scheduler)

    def busy(self) -> bool:
        """Jobs or micro-batches remain: the loop should step."""
        return self._engine.has_unfinished()

    def jobs(self, now: float | None = None) -> list[JobInfo]:
        """Every live job, with its rank (one walk of the queue order for all).

        Built once per state of the engine (an iteration, or any event: an arrival, an
        abort, a retune) and the same list until the next (read it, never change it):
        a client asking in a loop costs neither a walk nor a row per job of the engine
        thread's time, and the server encodes one reply per state. `waited` is as of the first asker since that state."""
        mark = self._mark()
        if self._rows is None or self._rows[0] != mark:
            now = time.time() if now is None else now
            ranks = self._ranks(mark)
            jobs = self._engine.scheduler.jobs()
            rows = [job_info(j, now, ranks.get(j.job_id)) for j in jobs]
            self._rows = (mark, rows)
        return self._rows[1]

    def _mark(self) -> tuple[int, int, int]:
        """The engine's state, as far as job rows tell: iterations, events, live jobs."""
        eng = self._engine
        return (eng.iterations, eng.events.count, len(eng.scheduler))

    def _drop_stale(self) -> None:
        """Forget the rows and ranks of a state the engine has left (each verb calls
        this): kept until the next asker, they held a few hundred bytes a job of the
        telemetry's job table that nobody would read."""
        rows, ranks = self._rows, self._rank_cache
        if rows is None and ranks is None:
            return
        mark = self._mark()
        if rows is not None and rows[0] != mark:
            self._rows = None
        if ranks is not None and ranks[0] != mark:
            self._rank_cache = None

    def _ranks(self, mark: tuple[int, int, int]) -> dict[str, int]:
        """The queue's order (one walk), kept for the engine state `mark`."""
        if self._rank_cache is None or self._rank_cache[0] != mark:
            self._rank_cache = (mark, self._engine.scheduler.queue.ranks())
        return self._rank_cache[1]

    def has(self, job_id: str) -> bool:
        """Whether the engine has this live job (a lookup, no walk of the queue)."""
        return self._engine.scheduler.get(job_id) is not None

    def job(self, job_id: str, now: float | None = None) -> JobInfo | None:
        """One live job with its rank (the queue's order of this state, `jobs`), None if none."""
        sched = self._engine.scheduler
        job = sched.get(job_id)
        if job is None:
            return None
        now = time.time() if now is None else now
        return job_info(job, now, self._ranks(self._mark()).get(job_id))

    def snapshot(
        self, now: float | None = None, with_jobs: bool = True, detail: bool = True
    ) -> EngineSnapshot:
        """The observable state now (read between iterations, on the loop's thread).
        `detail` False (a status reply, the stats line): no ENST, no job rows, no levels'
        job lists, so it costs one pass over the jobs, not a walk of the queue."""
        now = time.time() if now is None else now
        eng = self._engine
        sched = eng.scheduler
        if detail:
            sched.refresh_enst()
        stats = sched.stats(detail)  # after refresh_enst: the levels' order is the current one
        rows = self.jobs(now) if with_jobs and detail else None
        if rows is not None:
            running = sum(1 for r in rows if r.state == JobStatus.RUNNING.value)
        else:
            running = sum(1 for j in sched.jobs() if j.status is JobStatus.RUNNING)
        swapper = eng.swapper
        recent = eng.recent_iterations
        return EngineSnapshot(
            time=now,
            config=eng.config,
            sched=stats,
            kv=eng.blocks.stats(),
            swap=SwapBytes(swapper.bytes_in_flight, swapper.bytes_out, swapper.bytes_in),
            prefix=eng.blocks.prefix.stats(),
            iterations=list(itertools.islice(recent, max(0, len(recent) - RECENT_ITERATIONS), None)),
            iteration_count=eng.iterations,
            live=len(sched),
            running=running,
            degraded=eng.degraded,
            jobs=rows,
        )

    def level_counts(self) -> dict[int, tuple[int, int]]:
        """Per level with jobs (0-based): how many run and how many wait (one pass over
        the jobs, no walk of the queue's order)."""
        counts: dict[int, list[int]] = {}
        running = JobStatus.RUNNING
        for job in self._engine.scheduler.jobs():
            pair = counts.get(job.level)
            if pair is None:
                pair = counts[job.level] = [0, 0]
            pair[job.status is not running] += 1
        return {level: (r, w) for level, (r, w) in counts.items()}

    def history(self, slo: float) -> Any:
        """The scheduler frozen with its step history, for the what-if twin (fsd.twin):
        one pickling pass, milliseconds; `slo` the per-token target it scores against."""
        if self._snapshot is None:
            raise SettingError("this engine was started without previews (no snapshotter)")
        eng = self._engine
        return self._snapshot(eng.scheduler, eng.history, eng.config.sched, eng.config.cache, slo)

    def drain_events(self) -> list[EngineEvent]:
        """The engine's events since the last call (plain values)."""
        return self._engine.events.drain()

    # ---- the verbs ---------------------------------------------------------------

    def admit(self, request: JobRequest) -> Admitted:
        """Admit (fsd.admission) and queue one request (`Engine.enqueue`); FsdError if
        refused. One admitted where it entered (by the cluster face) is queued as it is."""
        job = self._engine.enqueue(request)
        self._drop_stale()
        return Admitted(job.job_id, job.num_prompt_tokens)

    def abort(self, job_id: str) -> RequestOutput:
        """End a job now (UnknownJobError if there is none); its result so far."""
        out = self._engine.abort(job_id)
        self._drop_stale()
        return out

    def retune(self, replica: int | None = None, /, **changes: Any) -> EngineConfig:
        """Change scheduling settings between iterations (SettingError: none changed);
        `replica`: 0 or None, the one replica there is."""
        if replica not in (None, 0):
            raise SettingError(f"this daemon runs one replica (0), not replica {replica}")
        return self._engine.retune(**changes)

    def drain_replica(self, index: int) -> dict[str, int]:
        raise SettingError("this daemon runs one replica: drain it whole (fsctl drain)")

    undrain_replica = drain_replica

    def routing_state(self, watcher: Any, index: int, admitted: int) -> tuple[Any, Any]:
        """This engine's compact state for a router (fsd.router.state), as replica
        `index` that has taken `admitted` requests: (its builder, the state). The
        builder is made on the first call and watches the prefix cache from then on."""
        from fsd.router.state import StateBuilder

        eng = self._engine
        watcher = watcher or StateBuilder(index, eng.blocks)
        return watcher, watcher.build(eng.scheduler, time.time(), admitted)

    def take_out(self, job_id: str) -> MovedJob:
        """Remove a job that can move (fsd.engine.migration), with its host KV."""
        return take_out(self._engine, job_id)

    def bring_in(self, moved: MovedJob) -> None:
        """Queue a job moved here from another engine."""
        bring_in(self._engine, moved)

    def step(self) -> Stepped:
        """One iteration, timed into the step history; never raises.

        The engine fails a faulty job alone; if its step raises anyway (a bug), every
        live job is failed rather than the daemon, and `Stepped.failures` says why.
        """
        eng = self._engine
        failures: list[tuple[str, Exception]] = []
        seen = eng.iterations
        t0 = time.perf_counter()
        try:
            deltas = eng.step()
        except Exception as exc:  # noqa: BLE001 - last resort
            failures.append(("an engine step failed; its jobs are failed", exc))
            deltas = eng.fail_all(f"internal error: {type(exc).__name__}: {exc}")
        t1 = time.perf_counter()
        try:  # the iteration's wall time for the twin's clock (fsd.engine.history)
            ran = eng.last_schedule is not None and bool(eng.last_schedule.batch)
            predicted = eng.scheduler.predicted_iteration_time
            eng.history.stepped(t0, t1, predicted, ran, eng.has_unfinished())
        except Exception as exc:  # noqa: BLE001 - the history is advice, the tokens are not
            failures.append(("the loop's history failed", exc))
        new = min(eng.iterations - seen, len(eng.recent_iterations))
        done = list(itertools.islice(reversed(eng.recent_iterations), new))[::-1]
        self._drop_stale()
        return Stepped(deltas, done, t1 - t0, failures)

    def close(self) -> None:
        """Stop the engine's workers (the face cannot serve afterwards)."""
        self._engine.close()
