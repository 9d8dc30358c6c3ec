"""Maximum sustainable load under an SLO, by bisection on the arrival rate.

The load knob is a rate multiplier `s` on a base workload (`Workload.scaled(s)`):
for a trace it is the time scale, for a synthetic workload rate x s (a renewal
process at another rate is the same draws with scaled gaps, so the seed holds).
The search doubles or halves from `start` until it brackets the boundary, then
bisects geometrically until hi / lo <= 1 + tol. One search, two targets (predicates):

  slo        max rate: the run's `metric` (default: average per-token latency, the
             paper's §6.1 "maximum throughput under the SLO") is at most the SLO;
  goodput95  P95 goodput (FastServe §6, DistServe's attainment): at least 95% of the
             jobs meet both TTFT <= 10 x and TPOT <= 10 x their light-load means.

Both also need the run to be sustainable (fsd.sim.metrics: completed >= 97% of the
offered work over the second half of the arrivals): a finite run past capacity ends
and drains, and an SRPT-like policy can then keep its *average* under the SLO.
`bracketed` is False when no failing load was found within `scale_range`.

Light-load reference (`light_load`): the same requests with arrivals stretched to
1/20 of the base rate (`LIGHT_SCALE`), run under FCFS with the spec's other
settings, so that every policy is judged against one reference and the bounds do not
move with the policy or the probe. At 1/20 of a workload near capacity, batches hold
about one job (the Azure conversation trace at x0.3/20: mean batch 1.2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from fsd.cost import CostModel
from fsd.errors import ConfigError
from fsd.sched.slo import default_slo
from fsd.sim.metrics import joint_attainment
from fsd.sim.runner import RunSpec, map_tasks, run_one
from fsd.workload.spec import Workload

SWEEP_METRICS = ("avg", "p50", "p95", "p99")
SWEEP_TARGETS = ("slo", "goodput95")
LIGHT_SCALE = 1 / 20  # the reference load, as a multiplier on the base workload
GOODPUT_FACTOR = 10.0  # TTFT and TPOT bounds, in light-load means
GOODPUT_QUANTILE = 0.95  # fraction of jobs that must meet both
MAX_RUNS = 14  # runs per target
RANGE = (1 / 64, 64.0)  # the scales a search may reach

Row = dict[str, object]


@dataclass(frozen=True)
class LightLoad:
    """The goodput95 reference: FCFS's mean TTFT and TPOT at a light load."""

    scale: float  # multiplier on the base workload it ran at
    ttft: float  # mean seconds
    tpot: float  # mean seconds (NaN when every job has one output token)
    factor: float = GOODPUT_FACTOR

    @property
    def ttft_slo(self) -> float:
        return self.factor * self.ttft

    @property
    def tpot_slo(self) -> float:
        return self.factor * self.tpot if math.isfinite(self.tpot) else math.inf

    def to_dict(self) -> dict[str, float]:
        return {
            "scale": self.scale,
            "ttft": self.ttft,
            "tpot": self.tpot,
            "factor": self.factor,
            "ttft_slo": self.ttft_slo,
            "tpot_slo": self.tpot_slo,
        }


@dataclass(frozen=True)
class SweepResult:
    """The highest feasible load found for one target, and every point it tried."""

    label: str
    max_scale: float  # rate multiplier on the base workload (0 if none was feasible)
    max_rate: float  # requests/s at that multiplier
    metrics: Row | None  # the row at max_scale
    points: list[dict[str, float | bool]] = field(default_factory=list)
    bracketed: bool = True  # False: no infeasible load was found (max_scale is a lower bound)
    target: str = "slo"
    reference: LightLoad | None = None  # goodput95's light-load reference

    def to_dict(self) -> dict[str, object]:
        extra = {"reference": self.reference.to_dict()} if self.reference else {}
        return {
            "target": self.target,
            "max_scale": self.max_scale,
            "max_rate": self.max_rate,
            "bracketed": self.bracketed,
            "points": self.points,
            **extra,
            **(self.metrics or {}),
        }


def light_load(
    spec: RunSpec, cost: CostModel, workload: Workload, scale: float = LIGHT_SCALE
) -> LightLoad:
    """FCFS's mean TTFT and TPOT on `workload` at `scale` x its rate (see module doc)."""
    ref = replace(spec.with_policy("fcfs", "light-load fcfs"), jobs_csv=None, kv_sample_s=None)
    row = run_one(ref, cost, workload.scaled(scale))
    return LightLoad(scale, float(row["ttft"]), float(row["tpot"]))  # type: ignore[arg-type]


def search(
    ok: Callable[[float], bool],
    start: float,
    tol: float,
    max_runs: int,
    scale_range: tuple[float, float],
) -> tuple[float | None, float | None, list[float]]:
    """Bracket, then bisect geometrically: (highest ok, lowest failing, scales tried)."""
    lo: float | None = None
    hi: float | None = None
    tried: list[float] = []
    s = start
    for _ in range(max_runs):
        tried.append(s)
        if ok(s):
            lo = s
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
    return lo, hi, tried


def feasible(row: Row, target: str, metric: str, slo: float) -> bool:
    """The target's predicate on one run's row; an unsustainable run always fails."""
    if not row["sustainable"]:
        return False
    if target == "slo":
        return float(row[metric]) <= slo  # type: ignore[arg-type]
    return float(row["joint_attainment"]) >= GOODPUT_QUANTILE  # type: ignore[arg-type]


def _probe(spec: RunSpec, cost: CostModel, workload: Workload, ref: LightLoad | None) -> Row:
    """`run_one` plus, with a reference, the jobs' joint TTFT/TPOT attainment."""
    sim = spec.simulator(cost)
    result = sim.run(workload)
    row: Row = dict(result.metrics)
    row.update(policy=result.policy, kv_policy=spec.cache.kv_policy)
    row.update(num_gpu_blocks=sim.pools.device, num_host_blocks=sim.pools.host)
    if ref is not None:
        row["joint_attainment"] = joint_attainment(result.jobs, ref.ttft_slo, ref.tpot_slo)
    return row


def _check(metric: str, targets: Sequence[str], start: float, tol: float) -> None:
    if metric not in SWEEP_METRICS:
        raise ConfigError(f"sweep metric must be one of {', '.join(SWEEP_METRICS)}; got {metric!r}")
    if not targets or any(t not in SWEEP_TARGETS for t in targets):
        raise ConfigError(f"sweep targets must be among {', '.join(SWEEP_TARGETS)}; got {targets}")
    if not tol > 0 or not start > 0:
        raise ConfigError(f"sweep needs start > 0 and tol > 0, got {start} and {tol}")


def sweep_targets(
    spec: RunSpec,
    cost: CostModel,
    workload: Workload,
    targets: Sequence[str] = SWEEP_TARGETS,
    metric: str = "avg",
    start: float = 1.0,
    tol: float = 0.05,
    max_runs: int = MAX_RUNS,
    scale_range: tuple[float, float] = RANGE,
    reference: LightLoad | None = None,
) -> dict[str, SweepResult]:
    """One search per target, sharing the runs at the scales they both try."""
    _check(metric, targets, start, tol)
    slo = spec.slo if spec.slo is not None else default_slo(cost)
    if "goodput95" in targets and reference is None:
        reference = light_load(spec, cost, workload)
    rows: dict[float, Row] = {}

    def row_at(s: float) -> Row:
        if s not in rows:  # why: doubling from `start` hits the same scales for each target
            rows[s] = _probe(spec, cost, workload.scaled(s), reference)
        return rows[s]

    out: dict[str, SweepResult] = {}
    for target in targets:
        lo, hi, tried = search(
            lambda s, t=target: feasible(row_at(s), t, metric, slo),
            start,
            tol,
            max_runs,
            scale_range,
        )
        points = [_point(s, rows[s], workload.rate, metric, target, slo) for s in tried]
        best = rows[lo] if lo is not None else None
        ref = reference if target == "goodput95" else None
        scale = lo or 0.0
        out[target] = SweepResult(
            spec.label, scale, workload.rate * scale, best, points, hi is not None, target, ref
        )
    return out


def _point(
    s: float, row: Row, base_rate: float, metric: str, target: str, slo: float
) -> dict[str, float | bool]:
    point: dict[str, float | bool] = {"scale": s, "rate": base_rate * s}
    point[metric] = float(row[metric])  # type: ignore[arg-type]
    if "joint_attainment" in row:
        point["joint_attainment"] = float(row["joint_attainment"])  # type: ignore[arg-type]
    point["throughput_ratio"] = float(row["throughput_ratio"])  # type: ignore[arg-type]
    point["sustainable"] = bool(row["sustainable"])
    point["feasible"] = feasible(row, target, metric, slo)
    return point


def sweep(
    spec: RunSpec,
    cost: CostModel,
    workload: Workload,
    metric: str = "avg",
    start: float = 1.0,
    tol: float = 0.05,
    max_runs: int = MAX_RUNS,
    scale_range: tuple[float, float] = RANGE,
    target: str = "slo",
) -> SweepResult:
    """Bisect the rate multiplier for the largest sustainable load that meets `target`."""
    found = sweep_targets(
        spec, cost, workload, (target,), metric, start, tol, max_runs, scale_range
    )
    return found[target]


def _task(args: tuple) -> dict[str, SweepResult]:
    return sweep_targets(*args)


def sweep_all(
    specs: Sequence[RunSpec],
    cost: CostModel,
    workload: Workload,
    metric: str = "avg",
    start: float = 1.0,
    tol: float = 0.05,
    jobs: int = 1,
    targets: Sequence[str] = SWEEP_TARGETS,
) -> dict[str, dict[str, SweepResult]]:
    """Every target's sweep per spec (in parallel processes when jobs > 1), by label.

    The light-load reference runs once per distinct configuration (specs that differ
    only in policy share it), before the sweeps.
    """
    _check(metric, targets, start, tol)
    refs: list[tuple[RunSpec, LightLoad]] = []
    tasks = []
    for spec in specs:
        ref = None
        if "goodput95" in targets:
            key = replace(spec.with_policy("fcfs", "ref"), jobs_csv=None, kv_sample_s=None)
            ref = next((r for k, r in refs if k == key), None)
            if ref is None:
                ref = light_load(spec, cost, workload)
                refs.append((key, ref))
        tasks.append(
            (spec, cost, workload, tuple(targets), metric, start, tol, MAX_RUNS, RANGE, ref)
        )
    results = map_tasks(_task, tasks, jobs)
    return {s.label: r for s, r in zip(specs, results, strict=True)}
