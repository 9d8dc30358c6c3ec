"""The discrete-event simulator: the real scheduler and block manager, a cost model for time.

Events are request arrivals, iteration ends and the ends of asynchronous KV copies.
At each iteration boundary the simulator admits the requests that have arrived,
reports finished copies (`swap_done`), asks the scheduler for a batch, and advances
the clock by

    sum of the batch's synchronous swaps (swap_time of their tokens, outs then ins)
  + cost.iteration_time(prefill lengths, decode contexts)

after which every batched job has produced one token (prefill and decode alike).
Asynchronous copies (proactive swapping) go through a host link per direction:
FIFO, one copy at a time, each taking swap_time(blocks x block_size); they overlap
the model step and end on their own clock. With an empty batch the clock jumps to
the next arrival or copy end. Synchronous copies are modelled on the critical path
only (they do not queue behind asynchronous ones on the link): a simplification that
favours `reactive` slightly.

Pipeline parallelism (the profile's `pipeline_stages`, paper §4.3) is described atop
`_Pipeline`; with one stage it reduces exactly to the loop above.

Nothing is random here: a run is a pure function of the workload, configs and cost.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass, field

from fsd.config import CacheConfig, SchedConfig
from fsd.errors import FsdError
from fsd.jobs import FinishReason
from fsd.kv.block_manager import BlockManager
from fsd.kv.swap import SwapOp
from fsd.sched.profile import CostModel
from fsd.sched.registry import SLO_DECODE_STEPS, make_scheduler, resolve_policy
from fsd.sched.scheduler import Scheduler, SchedulerOutput
from fsd.sim.capacity import Pools, size_pools
from fsd.sim.job import SimJob
from fsd.sim.metrics import Counters, summarize
from fsd.workload.spec import Workload


class SimulationError(FsdError):
    """The workload cannot be served as configured (e.g. a job that can never fit)."""


def default_slo(cost: CostModel) -> float:
    """The paper's latency SLO: 10 x a decode step (profile.min_iteration_time)."""
    return SLO_DECODE_STEPS * cost.min_iteration_time


@dataclass
class SimResult:
    """One run: the finished jobs, the metric row, and optional KV-usage samples."""

    policy: str
    metrics: dict[str, float | int]
    jobs: list[SimJob]
    pools: Pools
    kv_series: list[tuple[float, int, int, int]] = field(default_factory=list)  # t, dev, host, jobs
    wall_s: float = 0.0
    scheduler: Scheduler | None = None


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

    __slots__ = ("stages", "free_at", "flight", "busy")

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self.free_at = [0.0] * stages  # when each stage finishes its current micro-batch
        self.flight: deque[_MicroBatch] = deque()  # oldest first = the next to leave
        self.busy: set[str] = set()  # ids of the jobs in flight

    def can_enter(self, now: float) -> bool:
        return self.free_at[0] <= now and len(self.flight) < self.stages

    def enter(self, now: float, stage_s: float, out: SchedulerOutput) -> float:
        """Start `out`'s batch at `now`; returns when it leaves the last stage."""
        t = now
        free_at = self.free_at
        for k in range(self.stages):
            start = free_at[k] if free_at[k] > t else t
            t = free_at[k] = start + stage_s
        self.flight.append(_MicroBatch(out, t))
        if self.stages > 1:  # with one stage nothing is in flight at a decision
            self.busy.update(job.job_id for job in out.batch)
        return t

    def next_exit(self) -> float:
        return self.flight[0].exit if self.flight else float("inf")

    def leave(self) -> _MicroBatch:
        """The oldest micro-batch, which has left the last stage."""
        mb = self.flight.popleft()
        if self.stages > 1:
            self.busy.difference_update(job.job_id for job in mb.out.batch)
        return mb


class Simulator:
    """Replays a workload through one scheduling policy and KV policy on a cost model."""

    def __init__(
        self,
        cost: CostModel,
        sched: SchedConfig | None = None,
        cache: CacheConfig | None = None,
        num_gpu_blocks: int | None = None,
        num_host_blocks: int | None = None,
        slo: float | None = None,
        kv_sample_s: float | None = None,
        pipeline_stages: int | None = None,
    ) -> None:
        self.cost = cost
        stages = cost.pipeline_stages if pipeline_stages is None else pipeline_stages
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
            raise SimulationError(f"pipeline_stages must be an integer >= 1, got {stages!r}")
        self.pipeline_stages = stages
        self.sched_config = sched or SchedConfig()
        self.cache_config = cache or CacheConfig()
        resolve_policy(self.sched_config.policy)  # a clear error before any work
        self.pools = size_pools(cost, self.cache_config, num_gpu_blocks, num_host_blocks)
        self.slo = default_slo(cost) if slo is None else slo
        if self.slo <= 0:
            raise SimulationError(f"slo must be > 0 seconds per token, got {self.slo}")
        self.kv_sample_s = kv_sample_s

    def check(self, workload: Workload) -> None:
        """Refuse requests that could never run (they would stall the simulation)."""
        limit = self.sched_config.max_batch_tokens
        bs = self.cache_config.block_size
        for i, r in enumerate(workload):
            # a job whose KV was dropped re-prefills prompt + generated tokens at once
            longest = r.prompt_len + r.output_len - 1
            if longest > limit:
                raise SimulationError(
                    f"request {i} needs {longest} tokens in one iteration (prompt {r.prompt_len}"
                    f" + output {r.output_len} - 1) but max_batch_tokens is {limit}: raise "
                    "max_batch_tokens or clip the workload to a shorter max context"
                )
            need = -(-(r.prompt_len + r.output_len) // bs)
            if need > self.pools.device:
                raise SimulationError(
                    f"request {i} needs {need} KV blocks but the device holds "
                    f"{self.pools.device}: raise num_gpu_blocks or clip the workload"
                )

    def run(self, workload: Workload) -> SimResult:
        """Simulate until every request has finished; returns its metrics."""
        self.check(workload)
        t_wall = time.perf_counter()
        cost, bs = self.cost, self.cache_config.block_size
        blocks = BlockManager(self.pools.device, bs, self.pools.host)
        sched = make_scheduler(self.sched_config, self.cache_config, blocks, cost)
        jobs = [
            SimJob(f"r{i}", r.arrival, r.prompt_len, r.output_len) for i, r in enumerate(workload)
        ]
        links = {"out": _Link(), "in": _Link()}
        copies: list[tuple[float, int, SwapOp]] = []  # (end, seq, op) min-heap
        seq = 0
        c = Counters()
        series: list[tuple[float, int, int, int]] = []
        next_sample = 0.0
        sample_every = self.kv_sample_s
        device, host = blocks.device, blocks.host
        stages = self.pipeline_stages
        pipe = _Pipeline(stages)
        inf = float("inf")
        n, i = len(jobs), 0
        now = jobs[0].arrival_time if jobs else 0.0
        live = 0
        while True:
            # Order at one instant (kept from the unpipelined loop, where it is the
            # only order): finished micro-batches, then arrivals, then ended copies.
            while pipe.flight and pipe.flight[0].exit <= now:
                mb = pipe.leave()
                live -= _emit_tokens(mb.out, mb.exit)
                sched.update(mb.out, mb.exit)
            while i < n and jobs[i].arrival_time <= now:
                sched.add(jobs[i], jobs[i].arrival_time)
                i += 1
                live += 1
            while copies and copies[0][0] <= now:
                sched.swap_done(heapq.heappop(copies)[2])
            if live == 0 and i >= n and not copies:
                break
            if not pipe.can_enter(now):
                # stage 1 is busy (or the pipeline full): nothing to decide until it frees
                # or a micro-batch leaves; arrivals meanwhile wait for that decision
                wake = pipe.next_exit()
                if pipe.free_at[0] > now and pipe.free_at[0] < wake:
                    wake = pipe.free_at[0]
                now = wake
                continue
            if live > c.peak_jobs:
                c.peak_jobs = live
            out = sched.schedule(now, busy=pipe.busy)
            sync_s = 0.0
            for op in out.swap_out + out.swap_in:
                secs = cost.swap_time(op.num_blocks * bs)
                if op.sync:
                    sync_s += secs
                else:
                    c.async_swap_s += secs
                    end = links[op.direction].submit(now, secs)
                    heapq.heappush(copies, (end, seq, op))
                    seq += 1
            used = device.num_blocks - device.num_free
            if used > c.peak_device_blocks:
                c.peak_device_blocks = used
            used_host = host.num_blocks - host.num_free
            if used_host > c.peak_host_blocks:
                c.peak_host_blocks = used_host
            if sample_every is not None and now >= next_sample:
                series.append((now, used, used_host, live))
                next_sample = now + sample_every
            batch = out.batch
            if not batch:
                sched.update(out, now)
                nxt = min(
                    jobs[i].arrival_time if i < n else inf,
                    copies[0][0] if copies else inf,
                    pipe.next_exit(),
                )
                if nxt == inf:
                    if live:
                        raise SimulationError(self._stalled(sched, now))
                    break
                now = max(nxt, now)
                continue
            prefills: list[int] = []
            contexts: list[int] = []
            for job in batch:
                new = job.num_tokens - job.num_computed_tokens
                if new > 1:
                    prefills.append(new)
                else:
                    contexts.append(job.num_tokens)
            # every stage makes its own share of the synchronous copies, on its own links
            stage_s = sync_s + cost.iteration_time(prefills, contexts) / stages
            exit_at = pipe.enter(now, stage_s, out)
            c.iterations += 1
            c.busy_s += stage_s
            c.sync_swap_s += sync_s
            c.batched_jobs += len(batch)
            c.prefill_tokens += sum(prefills)
            now = min(pipe.free_at[0], exit_at)
        blocks.check()
        if (
            sched.has_unfinished()
            or device.num_free != device.num_blocks
            or host.num_free != host.num_blocks
        ):
            raise SimulationError("simulation ended with jobs or KV blocks still held")
        metrics = summarize(jobs, c, self.slo)
        metrics["sim_wall_s"] = time.perf_counter() - t_wall
        return SimResult(
            sched.name, metrics, jobs, self.pools, series, metrics["sim_wall_s"], sched
        )

    def _stalled(self, sched: Scheduler, now: float) -> str:
        stuck = list(sched.jobs())[:3]
        desc = ", ".join(
            f"{j.job_id} (prompt {j.num_prompt_tokens}, {j.num_tokens} tokens, kv {j.kv.value}, "
            f"{len(j.block_table)} device / {len(j.host_block_table)} host blocks)"
            for j in stuck
        )
        return (
            f"simulation stalled at t={now:.3f}s: {len(sched)} jobs wait, nothing runs and no "
            f"event is pending ({sched.name}, kv {self.cache_config.kv_policy}, "
            f"{sched.blocks.num_free}/{sched.blocks.device.num_blocks} device blocks free); "
            f"first: {desc}"
        )


def _emit_tokens(out: SchedulerOutput, at: float) -> int:
    """Every job of a finished (micro-)batch produced one token at `at`; returns how
    many jobs that finished."""
    finished = 0
    for job in out.batch:
        job.num_computed_tokens = job.num_tokens
        job.num_tokens += 1  # type: ignore[misc]
        tokens = job.output_token_ids
        tokens.n += 1  # type: ignore[attr-defined]
        if job.first_token_time is None:
            job.first_token_time = at
        if tokens.n >= job.max_output:  # type: ignore[attr-defined]
            job.finish(FinishReason.LENGTH, at)
            finished += 1
    return finished


def simulate(
    workload: Workload,
    cost: CostModel,
    policy: str = "default",
    kv_policy: str = "proactive",
    **options: object,
) -> SimResult:
    """One-call convenience: `options` are SchedConfig / CacheConfig fields or Simulator
    arguments (num_gpu_blocks, num_host_blocks, slo, kv_sample_s, pipeline_stages)."""
    sched_fields = set(SchedConfig.__dataclass_fields__)
    cache_fields = set(CacheConfig.__dataclass_fields__) - {"num_gpu_blocks", "num_host_blocks"}
    sim_args = {"num_gpu_blocks", "num_host_blocks", "slo", "kv_sample_s", "pipeline_stages"}
    unknown = set(options) - sched_fields - cache_fields - sim_args
    if unknown:
        raise SimulationError(f"unknown simulation option(s): {', '.join(sorted(unknown))}")
    sched = SchedConfig(policy=policy, **{k: v for k, v in options.items() if k in sched_fields})  # type: ignore[arg-type]
    cache = CacheConfig(
        kv_policy=kv_policy,
        **{k: v for k, v in options.items() if k in cache_fields},  # type: ignore[arg-type]
    )
    sim = Simulator(cost, sched, cache, **{k: v for k, v in options.items() if k in sim_args})  # type: ignore[arg-type]
    return sim.run(workload)
