"""The simulator's event loop: arrivals, iteration ends, copy ends, on a cost model's clock.

At each iteration boundary the loop admits the requests that have arrived, reports
finished copies (`swap_done`), asks the scheduler for a batch, and advances the
clock by the batch's synchronous swaps plus its profiled iteration time; every
batched job then produces one token (`Job.append_token`, the engine's rule), but a
prefill chunk short of the end, which only fills KV (`Job.absorb_chunk`).
Asynchronous copies go through a host link per direction, FIFO, one at a time.
Pipeline parallelism (the profile's `pipeline_stages`) is described atop `_Pipeline`;
with one stage it reduces exactly to the loop above.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from fsd.admission import refuse_late
from fsd.cost import CostModel
from fsd.errors import FsdError, OverloadedError
from fsd.jobs import KVLocation
from fsd.kv.block_manager import BlockManager
from fsd.kv.swap import SwapOp
from fsd.sched.decision import SchedulerOutput
from fsd.sched.pipeline import InFlight
from fsd.sched.room import NO_CONTEXT_LIMIT
from fsd.sched.scheduler import Scheduler
from fsd.sched.slo import default_slo
from fsd.sim.job import SimJob
from fsd.sim.metrics import Counters

_INF = float("inf")
PROGRESS_EVERY = 4096  # loop passes between two progress reports


class SimulationError(FsdError):
    """The workload cannot be served as configured (e.g. a job that can never fit)."""


class _Link:
    """One direction of the host link: copies pass one at a time, in order."""

    __slots__ = ("free_at",)

    def __init__(self) -> None:
        self.free_at = 0.0

    def submit(self, now: float, seconds: float) -> float:
        start = self.free_at if self.free_at > now else now
        self.free_at = start + seconds
        return self.free_at


@dataclass
class _MicroBatch:
    """A batch inside the pipeline: its tokens exist once it leaves the last stage."""

    out: SchedulerOutput
    exit: float


class _Pipeline:
    """The model's pipeline stages, and the micro-batches inside them.

    Design (paper §4.3). The model is split into `stages` equal stages; a micro-batch
    holds each stage for its stage time: the profile's iteration latency over the
    stages (as `CostModel.stage_time`), plus its synchronous swaps, which every stage
    makes for its own layers' KV on its own links. It enters stage k+1 when it has left stage k and stage k+1 is free,
    so stages work on different micro-batches at once and the micro-batches leave in
    the order they entered. A new micro-batch is scheduled whenever stage 1 is free
    and fewer than `stages` are in flight; the jobs in flight are `busy` for that
    decision (still queued, not ready, their KV pinned), so no job is ever in two
    micro-batches. A micro-batch's tokens arrive, and the scheduler charges its
    service (`update`), when it leaves the last stage.

    With one stage, stage 1 frees exactly when the batch ends: one batch at a time,
    the unpipelined loop, to the last floating-point bit.
    """

    __slots__ = ("stages", "free_at", "flight")

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self.free_at = [0.0] * stages  # when each stage finishes its current micro-batch
        self.flight: InFlight[_MicroBatch] = InFlight()  # oldest first = the next to leave

    @property
    def busy(self) -> set[str]:
        """Ids of the jobs in flight."""
        return self.flight.busy

    def can_enter(self, now: float) -> bool:
        return self.free_at[0] <= now and len(self.flight) < self.stages

    def enter(self, now: float, stage_s: float, out: SchedulerOutput) -> float:
        """Start `out`'s batch at `now`; returns when it leaves the last stage."""
        t = now
        free_at = self.free_at
        for k in range(self.stages):
            start = free_at[k] if free_at[k] > t else t
            t = free_at[k] = start + stage_s
        self.flight.push(_MicroBatch(out, t))
        return t

    def next_exit(self) -> float:
        return self.flight.oldest().exit if self.flight else float("inf")

    def leave(self) -> _MicroBatch:
        """The oldest micro-batch, which has left the last stage."""
        return self.flight.pop()


class EventLoop:
    """One run's clock and events over a scheduler; `run()` until every job is done."""

    def __init__(
        self,
        cost: CostModel,
        sched: Scheduler,
        jobs: list[SimJob],
        stages: int,
        kv_sample_s: float | None,
        stalled: Callable[[Scheduler, float], str],
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """`on_progress(done, total)`: told the finished jobs every few thousand decisions
        and at the end (a command's progress bar; the loop itself draws nothing)."""
        self.cost = cost
        self.sched = sched
        self.blocks: BlockManager = sched.blocks
        self.jobs = jobs
        self.n, self.i = len(jobs), 0  # jobs, and the next one to arrive
        self.live = 0  # arrived and unfinished
        self.links = {"out": _Link(), "in": _Link()}
        self.copies: list[tuple[float, int, SwapOp]] = []  # (end, seq, op) min-heap
        self.seq = 0
        self.counters = Counters()
        self.series: list[tuple[float, int, int, int]] = []  # t, device, host, jobs
        self.next_sample = 0.0
        self.sample_every = kv_sample_s
        self.stages = stages
        self.pipe = _Pipeline(stages)
        self._stalled = stalled
        self._on_progress = on_progress

    def resume(self, now: float, copies: list[SwapOp]) -> None:
        """Start inside a running system (the what-if twin): the scheduler already holds
        its jobs, and `copies` are in flight from `now` (each queued on its link)."""
        self.live = len(self.sched)
        bs = self.blocks.block_size
        for op in copies:
            end = self.links[op.direction].submit(now, self.cost.swap_time(op.num_blocks * bs))
            heapq.heappush(self.copies, (end, self.seq, op))
            self.seq += 1

    def waiting(self) -> list[str]:
        """The arrived jobs that have not started (no token, no KV, not in flight): the
        ones a rebalancer may move (fsd.sim.replicas)."""
        busy = self.pipe.busy
        return [
            j.job_id for j in self.sched.jobs()
            if not j.output_token_ids and j.kv is KVLocation.NONE and not j.num_computed_tokens
            and j.job_id not in busy
        ]  # fmt: skip

    def take(self, job_id: str) -> SimJob:
        """Remove a job that has not started (`waiting`), to run on another loop."""
        job = self.sched.get(job_id)
        assert job is not None and job_id in self.waiting(), job_id
        self.sched.remove(job)
        self.live -= 1
        return job  # type: ignore[return-value]

    def give(self, job: SimJob, now: float) -> None:
        """A job taken from another loop joins this one's scheduler at `now`."""
        self.sched.add(job, now)
        self.live += 1

    def add(self, job: SimJob) -> None:
        """One more job, arriving no earlier than the last (a router's, fsd.sim.replicas)."""
        self.jobs.append(job)
        self.n += 1

    def run(self, start: float | None = None, until: float = _INF, hold: bool = False) -> float:
        """Run from `start` (the first arrival) until every job is done, or until the
        first decision at or past `until`; returns the clock then.

        `hold`: stop before that decision, nothing at its instant applied, and count
        `until` as an event (an arrival the loop does not know yet: `add` it, then
        `run` again from the clock returned, exactly as if it had been known)."""
        pipe, sched, c = self.pipe, self.sched, self.counters
        now = start if start is not None else self.jobs[0].arrival_time if self.jobs else 0.0
        report, countdown = self._on_progress, PROGRESS_EVERY
        while True:
            if hold and now >= until:
                return now
            self._settle(now)
            if report is not None:
                countdown -= 1
                if countdown == 0:  # a countdown: the clock would cost more than the call
                    countdown = PROGRESS_EVERY
                    report(self.i - self.live, self.n)
            if now >= until or (self.live == 0 and self.i >= self.n and not self.copies):
                if report is not None:
                    report(self.i - self.live, self.n)
                return now
            if not pipe.can_enter(now):
                # stage 1 is busy (or the pipeline full): nothing to decide until it frees
                # or a micro-batch leaves; arrivals meanwhile wait for that decision
                wake = pipe.next_exit()
                if pipe.free_at[0] > now and pipe.free_at[0] < wake:
                    wake = pipe.free_at[0]
                now = wake
                continue
            if self.live > c.peak_jobs:
                c.peak_jobs = self.live
            out = sched.schedule(now, busy=pipe.busy)
            sync_s = self._start_copies(out, now)
            self._observe(now)
            if out.batch:
                now = self._enter(out, now, sync_s)
                continue
            sched.update(out, now)
            nxt = self._next_event()
            if hold and until < nxt:
                nxt = until
            if nxt == _INF:
                if self.live:
                    raise SimulationError(self._stalled(sched, now))
                return now
            now = max(nxt, now)

    def _settle(self, now: float) -> None:
        """Apply what happened by `now`. Order at one instant (kept from the unpipelined
        loop, where it is the only order): finished micro-batches, arrivals, copies."""
        pipe, sched, jobs, copies = self.pipe, self.sched, self.jobs, self.copies
        while pipe.flight and pipe.flight.oldest().exit <= now:
            mb = pipe.leave()
            self.live -= _emit_tokens(mb.out, mb.exit)
            sched.update(mb.out, mb.exit)
        while self.i < self.n and jobs[self.i].arrival_time <= now:
            job = jobs[self.i]
            sched.add(job, job.arrival_time)
            self.i += 1
            self.live += self._kept(job)
        while copies and copies[0][0] <= now:
            sched.swap_done(heapq.heappop(copies)[2])

    def _kept(self, job: SimJob) -> bool:
        """Whether `job`, just queued, escapes the overload refusals (as the engine's)."""
        config = self.sched.config
        if config.refuse_wait is None and config.refuse_late is None:
            return True
        try:
            refuse_late(self.sched, job, job.arrival_time, default_slo(self.cost))
        except OverloadedError:
            self.sched.remove(job)
            job.refused = True
            return False
        return True

    def _start_copies(self, out: SchedulerOutput, now: float) -> float:
        """Queue the asynchronous copies on their links; returns the synchronous seconds."""
        sync_s = 0.0
        bs, c = self.blocks.block_size, self.counters
        if out.cache_copies:  # the prefix cache's, all synchronous: scattered blocks,
            one = self.cost.swap_time(bs)  # each charged as a copy of its own
            for op in out.cache_copies:
                for _ in op.src:
                    sync_s += one
        for op in out.swap_out + out.swap_in:
            secs = self.cost.swap_time(op.num_blocks * bs)
            if op.sync:
                sync_s += secs
            else:
                c.async_swap_s += secs
                end = self.links[op.direction].submit(now, secs)
                heapq.heappush(self.copies, (end, self.seq, op))
                self.seq += 1
        return sync_s

    def _observe(self, now: float) -> None:
        """Peak KV use, and a sample of it every `kv_sample_s`."""
        c, device, host = self.counters, self.blocks.device, self.blocks.host
        used = device.num_blocks - device.num_free
        if used > c.peak_device_blocks:
            c.peak_device_blocks = used
        used_host = host.num_blocks - host.num_free
        if used_host > c.peak_host_blocks:
            c.peak_host_blocks = used_host
        if self.sample_every is not None and now >= self.next_sample:
            self.series.append((now, used, used_host, self.live))
            self.next_sample = now + self.sample_every

    def _next_event(self) -> float:
        return min(
            self.jobs[self.i].arrival_time if self.i < self.n else _INF,
            self.copies[0][0] if self.copies else _INF,
            self.pipe.next_exit(),
        )

    def _enter(self, out: SchedulerOutput, now: float, sync_s: float) -> float:
        """Start the batch through the pipeline; returns the next decision time."""
        prefills: list[int] = []
        cached: list[int] = []
        contexts: list[int] = []
        for job in out.batch:
            new = job.step_tokens
            if new > 1:
                prefills.append(new)
                cached.append(job.num_computed_tokens)
            else:
                contexts.append(job.num_tokens)
        # every stage makes its own share of the synchronous copies, on its own links
        stage_s = sync_s + self.cost.iteration_time(prefills, contexts, cached) / self.stages
        exit_at = self.pipe.enter(now, stage_s, out)
        c = self.counters
        c.iterations += 1
        c.busy_s += stage_s
        c.sync_swap_s += sync_s
        c.batched_jobs += len(out.batch)
        c.prefill_tokens += sum(prefills)
        return min(self.pipe.free_at[0], exit_at)


def _emit_tokens(out: SchedulerOutput, at: float) -> int:
    """Every job of a finished (micro-)batch produced one token at `at` (a prefill chunk
    short of the end, none); returns how many jobs that finished."""
    finished = 0
    for job in out.batch:
        if not job.step_samples:
            job.absorb_chunk()
            continue
        job.append_token(0, at)
        reason, _ = job.stop_after(0, (), NO_CONTEXT_LIMIT)
        if reason is not None:
            job.finish(reason, at)
            finished += 1
    return finished
