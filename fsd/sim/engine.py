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

The loop itself is `fsd.sim.loop.EventLoop`; pipeline parallelism (the profile's
`pipeline_stages`, paper §4.3) is described atop its `_Pipeline`.

Nothing is random here: a run is a pure function of the workload, configs and cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fsd.admission import RequestLimits, check_request
from fsd.config import CacheConfig, SchedConfig, check_prefill_chunk
from fsd.cost import CostModel
from fsd.errors import FsdError
from fsd.kv.block_manager import BlockManager
from fsd.sched.chunking import prefill_budget
from fsd.sched.registry import check_policies, make_scheduler
from fsd.sched.room import NO_CONTEXT_LIMIT
from fsd.sched.scheduler import Scheduler
from fsd.sched.slo import default_slo
from fsd.sim.capacity import Pools, size_pools
from fsd.sim.job import SimJob
from fsd.sim.loop import EventLoop, SimulationError
from fsd.sim.metrics import prefix_metrics, summarize
from fsd.workload.mooncake import MOONCAKE_BLOCK_TOKENS
from fsd.workload.spec import Workload


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
        check_policies(self.sched_config, self.cache_config, engine=False)  # before any work
        check_prefill_chunk(self.sched_config.prefill_chunk, self.cache_config.block_size)
        self.pools = size_pools(cost, self.cache_config, num_gpu_blocks, num_host_blocks)
        self.slo = default_slo(cost) if slo is None else slo
        if self.slo <= 0:
            raise SimulationError(f"slo must be > 0 seconds per token, got {self.slo}")
        self.kv_sample_s = kv_sample_s

    def check(self, workload: Workload) -> None:
        """Refuse requests that could never run (the engine's admission rule)."""
        limits = RequestLimits(
            NO_CONTEXT_LIMIT,
            self.sched_config.max_batch_tokens,
            self.pools.device,
            self.cache_config.block_size,
            prefill_budget(
                self.sched_config.prefill_chunk, self.cost, self.cache_config.block_size
            ),
        )
        for i, r in enumerate(workload):
            try:
                check_request(r.prompt_len, r.output_len, limits)
            except FsdError as exc:
                raise SimulationError(
                    f"request {i}: {exc} (raise the limit or clip the workload)"
                ) from None

    def run(
        self, workload: Workload, on_progress: Callable[[int, int], None] | None = None
    ) -> SimResult:
        """Simulate until every request has finished; returns its metrics.
        `on_progress(done, total)` hears of the finished requests now and then."""
        self.check(workload)
        t_wall = time.perf_counter()
        blocks = BlockManager(self.pools.device, self.cache_config.block_size, self.pools.host)
        hb = int(workload.params.get("hash_block", MOONCAKE_BLOCK_TOKENS))  # type: ignore[call-overload]
        sched = make_scheduler(self.sched_config, self.cache_config, blocks, self.cost)
        jobs = [
            SimJob(f"r{i}", r.arrival, r.prompt_len, r.output_len, workload.prefix_of(i), hb)
            for i, r in enumerate(workload)
        ]
        loop = EventLoop(
            self.cost, sched, jobs, self.pipeline_stages, self.kv_sample_s, self._stalled,
            on_progress,
        )  # fmt: skip
        loop.run()
        check_done(sched)
        metrics = summarize(jobs, loop.counters, self.slo)
        metrics.update(prefix_metrics(blocks.prefix.stats(), jobs))
        metrics["sim_wall_s"] = time.perf_counter() - t_wall
        return SimResult(
            sched.queue.name, metrics, jobs, self.pools, loop.series, metrics["sim_wall_s"], sched
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
            f"event is pending ({sched.queue.name}, kv {self.cache_config.kv_policy}, "
            f"{sched.blocks.num_free}/{sched.blocks.device.num_blocks} device blocks free); "
            f"first: {desc}"
        )


def check_done(sched: Scheduler) -> None:
    """Every job finished and every KV block came back (raise if not)."""
    blocks = sched.blocks
    blocks.check()
    device, host = blocks.device, blocks.host
    if (
        sched.has_unfinished()
        or device.num_free != device.num_blocks
        or host.num_free != host.num_blocks
    ):
        raise SimulationError("simulation ended with jobs or KV blocks still held")


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
