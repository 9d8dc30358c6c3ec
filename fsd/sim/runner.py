"""Run several simulations (one per policy or setting), in parallel processes if asked.

Each run is a pure function of its inputs, so spreading runs over processes changes
nothing but the wall time. Only metric rows travel back (not the 19k jobs); per-job
records, when asked for, are written to CSV by the process that ran the jobs.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from fsd.config import CacheConfig, ClusterConfig, SchedConfig
from fsd.cost import CostModel
from fsd.sim.engine import Simulator
from fsd.sim.records import write_jobs_csv
from fsd.sim.replicas import ReplicaSimulator
from fsd.workload.spec import Workload

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class RunSpec:
    """One simulation: a label and the configs it runs with (`cluster`: replicas behind
    a router, fsd.sim.replicas; one replica is the plain simulator)."""

    label: str
    sched: SchedConfig
    cache: CacheConfig
    num_gpu_blocks: int | None = None
    num_host_blocks: int | None = None
    slo: float | None = None
    kv_sample_s: float | None = None
    jobs_csv: Path | None = None  # write each job's record here (fsd.sim.records)
    cluster: ClusterConfig = ClusterConfig()  # its replicas and router

    def simulator(self, cost: CostModel) -> Simulator:
        names = ("num_gpu_blocks", "num_host_blocks", "slo", "kv_sample_s")
        options = {name: getattr(self, name) for name in names}
        if self.cluster.replicas > 1:
            return ReplicaSimulator(cost, self.sched, self.cache, cluster=self.cluster, **options)
        return Simulator(cost, self.sched, self.cache, **options)  # type: ignore[arg-type]

    def with_router(self, router: str, replicas: int | None = None, label: str | None = None) -> RunSpec:
        """The same run behind `router` (over `replicas`, if given)."""
        cluster = replace(self.cluster, router=router, replicas=replicas or self.cluster.replicas)
        return replace(self, label=label or router, cluster=cluster)

    def with_policy(self, policy: str, label: str | None = None) -> RunSpec:
        return replace(self, label=label or policy, sched=replace(self.sched, policy=policy))


def run_one(
    spec: RunSpec,
    cost: CostModel,
    workload: Workload,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, object]:
    """The metric row of one run (plus its KV samples when asked for);
    `on_progress(done, total)` hears of its finished requests now and then."""
    sim = spec.simulator(cost)
    result = sim.run(workload, on_progress)
    row: dict[str, object] = dict(result.metrics)
    row["policy"] = result.policy
    row["kv_policy"] = spec.cache.kv_policy
    row["num_gpu_blocks"] = sim.pools.device
    row["num_host_blocks"] = sim.pools.host
    if spec.kv_sample_s is not None:
        row["kv_series"] = [list(s) for s in result.kv_series]
    if spec.jobs_csv is not None:  # written where the run happened: the jobs stay there
        write_jobs_csv(spec.jobs_csv, result.jobs)
        row["jobs_csv"] = str(spec.jobs_csv)
    return row


def _task(args: tuple[RunSpec, CostModel, Workload]) -> dict[str, object]:
    return run_one(*args)


def _group(args: tuple[list[RunSpec], CostModel, Workload]) -> list[dict[str, object]]:
    specs, cost, workload = args
    return [run_one(s, cost, workload) for s in specs]


def pack(weights: Sequence[float], bins: int) -> list[list[int]]:
    """Indices grouped into `bins` groups with the smallest largest total weight.

    Exact for up to 12 items (every assignment is tried); longest-first greedy above.
    Why: five runs on two processes, scheduled one at a time, leave one process alone
    with the last long run; packing by expected cost evens the two out.
    """
    n = len(weights)
    bins = max(1, min(bins, n))
    if bins == 1:
        return [list(range(n))] if n else []
    if n <= 12:
        best: tuple[float, tuple[int, ...]] | None = None
        for assign in itertools.product(range(bins), repeat=n - 1):
            full = (0, *assign)  # item 0 in bin 0: bins are interchangeable
            loads = [0.0] * bins
            for i, b in enumerate(full):
                loads[b] += weights[i]
            if best is None or max(loads) < best[0]:
                best = (max(loads), full)
        assert best is not None
        groups: list[list[int]] = [[] for _ in range(bins)]
        for i, b in enumerate(best[1]):
            groups[b].append(i)
        return [g for g in groups if g]
    groups = [[] for _ in range(bins)]
    loads = [0.0] * bins
    for i in sorted(range(n), key=lambda i: -weights[i]):
        b = loads.index(min(loads))
        groups[b].append(i)
        loads[b] += weights[i]
    return [g for g in groups if g]


def map_tasks(fn: Callable[[T], R], tasks: Sequence[T], jobs: int) -> list[R]:
    """`fn` over `tasks`, in order; `jobs` > 1 uses that many worker processes at most."""
    if jobs <= 1 or len(tasks) <= 1:
        return [fn(t) for t in tasks]
    # fork: workers inherit the imported modules; each gets its own copy of the inputs
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as pool:
        return list(pool.map(fn, tasks))


def run_many(
    specs: Sequence[RunSpec],
    cost: CostModel,
    workload: Workload,
    jobs: int = 1,
    weights: Sequence[float] | None = None,
) -> dict[str, dict[str, object]]:
    """Rows keyed by label, in the order of `specs`; `jobs` > 1 uses worker processes.

    `weights`: each run's expected relative cost; given, the runs are packed into
    `jobs` fixed groups (see `pack`) instead of handed out one at a time.
    """
    tasks = [(s, cost, workload) for s in specs]
    if weights is None or jobs <= 1 or len(tasks) <= 1:
        rows = map_tasks(_task, tasks, jobs)
    else:
        groups = pack(weights, jobs)
        done = map_tasks(_group, [([specs[i] for i in g], cost, workload) for g in groups], jobs)
        by_index: dict[int, dict[str, object]] = {}
        for g, group_rows in zip(groups, done, strict=True):
            by_index.update(zip(g, group_rows, strict=True))
        rows = [by_index[i] for i in range(len(specs))]
    return {s.label: row for s, row in zip(specs, rows, strict=True)}
