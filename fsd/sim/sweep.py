"""Maximum load under the SLO, by bisection on the arrival rate.

The load knob is a rate multiplier `s` on a base workload (`Workload.scaled(s)`):
for a trace it is the time scale, for a synthetic workload rate x s (a renewal
process at another rate is the same draws with scaled gaps, so the seed holds).
A point is feasible when its `metric` (default: average per-token latency, as in the
paper's §6.1 "maximum throughput under the SLO") is at most the SLO. The search
doubles or halves from `start` until it brackets the boundary, then bisects
geometrically until hi / lo <= 1 + tol.

A finite workload has a catch: past capacity its backlog only grows for as long as
requests keep arriving, so a short slice at a huge rate is one burst that drains, and
an SRPT-like policy can keep the *average* under the SLO. Sweep over enough requests
(thousands) for the answer to mean a sustainable rate; `bracketed` is False when no
infeasible load was found within `scale_range`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from fsd.cost import CostModel
from fsd.errors import ConfigError
from fsd.sched.registry import default_slo
from fsd.sim.runner import RunSpec, run_one
from fsd.workload.spec import Workload

SWEEP_METRICS = ("avg", "p50", "p95", "p99")


@dataclass
class SweepResult:
    """The highest feasible load found and every point tried."""

    label: str
    max_scale: float  # rate multiplier on the base workload (0 if none was feasible)
    max_rate: float  # requests/s at that multiplier
    metrics: dict[str, object] | None  # the row at max_scale
    points: list[dict[str, float | bool]] = field(default_factory=list)
    bracketed: bool = True  # False: no infeasible load was found (max_scale is a lower bound)

    def to_dict(self) -> dict[str, object]:
        return {
            "max_scale": self.max_scale,
            "max_rate": self.max_rate,
            "bracketed": self.bracketed,
            "points": self.points,
            **(self.metrics or {}),
        }


def sweep(
    spec: RunSpec,
    cost: CostModel,
    workload: Workload,
    metric: str = "avg",
    start: float = 1.0,
    tol: float = 0.05,
    max_runs: int = 14,
    scale_range: tuple[float, float] = (1 / 64, 64.0),
) -> SweepResult:
    """Bisect the rate multiplier for the largest load whose `metric` meets the SLO."""
    if metric not in SWEEP_METRICS:
        raise ConfigError(f"sweep metric must be one of {', '.join(SWEEP_METRICS)}; got {metric!r}")
    if not tol > 0 or not start > 0:
        raise ConfigError(f"sweep needs start > 0 and tol > 0, got {start} and {tol}")
    slo = spec.slo if spec.slo is not None else default_slo(cost)
    base_rate = workload.rate
    lo: float | None = None
    hi: float | None = None
    best: dict[str, object] | None = None
    points: list[dict[str, float | bool]] = []
    s = start
    for _ in range(max_runs):
        row = run_one(spec, cost, workload.scaled(s))
        value = float(row[metric])  # type: ignore[arg-type]
        ok = value <= slo
        points.append({"scale": s, "rate": base_rate * s, metric: value, "feasible": ok})
        if ok:
            lo, best = s, row
        else:
            hi = s
        if lo is not None and hi is not None:
            if hi / lo <= 1 + tol:
                break
            s = math.sqrt(lo * hi)
        elif lo is None:
            if s <= scale_range[0]:
                break
            s /= 2
        else:
            if s >= scale_range[1]:
                break
            s *= 2
    max_scale = lo or 0.0
    return SweepResult(
        spec.label, max_scale, base_rate * max_scale, best, points, bracketed=hi is not None
    )


def _task(args: tuple) -> SweepResult:
    return sweep(*args)


def sweep_many(
    specs: Sequence[RunSpec],
    cost: CostModel,
    workload: Workload,
    metric: str = "avg",
    start: float = 1.0,
    tol: float = 0.05,
    jobs: int = 1,
) -> dict[str, SweepResult]:
    """One sweep per spec (in parallel processes when jobs > 1), keyed by label."""
    tasks = [(s, cost, workload, metric, start, tol) for s in specs]
    if jobs <= 1 or len(tasks) <= 1:
        results = [_task(t) for t in tasks]
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as pool:
            results = list(pool.map(_task, tasks))
    return {r.label: r for r in results}
