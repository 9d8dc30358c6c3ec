"""Run several simulations (one per policy or setting), in parallel processes if asked.

Each run is a pure function of its inputs, so spreading runs over processes changes
nothing but the wall time. Only metric rows travel back (not the 19k jobs).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from fsd.config import CacheConfig, SchedConfig
from fsd.sched.profile import CostModel
from fsd.sim.engine import Simulator
from fsd.workload.spec import Workload


@dataclass(frozen=True)
class RunSpec:
    """One simulation: a label and the configs it runs with."""

    label: str
    sched: SchedConfig
    cache: CacheConfig
    num_gpu_blocks: int | None = None
    num_host_blocks: int | None = None
    slo: float | None = None
    kv_sample_s: float | None = None

    def simulator(self, cost: CostModel) -> Simulator:
        return Simulator(
            cost,
            self.sched,
            self.cache,
            num_gpu_blocks=self.num_gpu_blocks,
            num_host_blocks=self.num_host_blocks,
            slo=self.slo,
            kv_sample_s=self.kv_sample_s,
        )

    def with_policy(self, policy: str, label: str | None = None) -> RunSpec:
        return replace(self, label=label or policy, sched=replace(self.sched, policy=policy))


def run_one(spec: RunSpec, cost: CostModel, workload: Workload) -> dict[str, object]:
    """The metric row of one run (plus its KV samples when asked for)."""
    sim = spec.simulator(cost)
    result = sim.run(workload)
    row: dict[str, object] = dict(result.metrics)
    row["policy"] = result.policy
    row["kv_policy"] = spec.cache.kv_policy
    row["num_gpu_blocks"] = sim.pools.device
    row["num_host_blocks"] = sim.pools.host
    if spec.kv_sample_s is not None:
        row["kv_series"] = [list(s) for s in result.kv_series]
    return row


def _task(args: tuple[RunSpec, CostModel, Workload]) -> dict[str, object]:
    return run_one(*args)


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def run_many(
    specs: Sequence[RunSpec], cost: CostModel, workload: Workload, jobs: int = 1
) -> dict[str, dict[str, object]]:
    """Rows keyed by label, in the order of `specs`; `jobs` > 1 uses worker processes."""
    tasks = [(s, cost, workload) for s in specs]
    if jobs <= 1 or len(tasks) <= 1:
        rows = [_task(t) for t in tasks]
    else:
        # fork: workers inherit the imported modules; each gets its own copy of the inputs
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as pool:
            rows = list(pool.map(_task, tasks))
    return {s.label: row for s, row in zip(specs, rows, strict=True)}
