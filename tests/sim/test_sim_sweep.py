"""Bisection for the largest load under the SLO."""

from __future__ import annotations

import pytest

from fsd.config import CacheConfig, SchedConfig
from fsd.errors import ConfigError
from fsd.sim.runner import RunSpec, pack, run_many
from fsd.sim.sweep import sweep
from fsd.workload import length_model, poisson, synthetic
from tests.costs import linear_cost

COST = linear_cost("s", prefill=(0.02, 1e-4), decode=(0.02, 5e-4, 1e-7))
WORK = synthetic(poisson(2.0), length_model("alpaca"), 400, seed=4)


def spec(policy: str, slo: float = 0.05) -> RunSpec:
    return RunSpec(
        policy,
        SchedConfig(policy=policy, max_batch_size=8),
        CacheConfig(),
        num_gpu_blocks=2000,
        slo=slo,
    )


def test_sweep_brackets_the_boundary_within_tolerance():
    r = sweep(spec("fcfs"), COST, WORK, tol=0.1)
    assert r.bracketed and r.max_scale > 0
    assert r.metrics is not None and r.metrics["avg"] <= 0.05
    assert r.max_rate == pytest.approx(WORK.rate * r.max_scale)
    bad = min(p["scale"] for p in r.points if not p["feasible"])
    assert r.max_scale < bad <= r.max_scale * 1.1 + 1e-12


def test_nothing_feasible_gives_zero():
    r = sweep(spec("fcfs", slo=1e-6), COST, WORK, max_runs=4)
    assert r.max_scale == 0.0 and r.metrics is None


def test_bad_sweep_arguments():
    with pytest.raises(ConfigError, match="sweep metric"):
        sweep(spec("fcfs"), COST, WORK, metric="mean")
    with pytest.raises(ConfigError, match="tol > 0"):
        sweep(spec("fcfs"), COST, WORK, tol=0)


def test_parallel_runs_equal_serial_runs():
    specs = [spec("fcfs"), spec("srpt"), spec("sj-mlfq")]
    a = run_many(specs, COST, WORK.head(150), jobs=1)
    b = run_many(specs, COST, WORK.head(150), jobs=2)
    c = run_many(specs, COST, WORK.head(150), jobs=2, weights=[1.0, 1.0, 2.0])
    assert list(a) == list(b) == list(c) == ["fcfs", "srpt", "sj-mlfq"]
    for label in a:
        for rows in (a, b, c):
            rows[label].pop("sim_wall_s")
        assert a[label] == b[label] == c[label]


@pytest.mark.parametrize(
    ("weights", "bins", "loads"),
    [
        ([0.6, 0.6, 0.8, 1.0, 1.0], 2, [2.0, 2.0]),  # not {1.0, 0.8} / {1.0, 0.6, 0.6}
        ([3, 3, 2, 2, 2], 2, [6, 6]),  # greedy longest-first would give 7 / 5
        ([1, 2, 3], 1, [6]),
        ([4, 1], 5, [4, 1]),  # more bins than runs
    ],
)
def test_pack_minimises_the_largest_group(weights, bins, loads):
    groups = pack(weights, bins)
    assert sorted(i for g in groups for i in g) == list(range(len(weights)))
    assert sorted(sum(weights[i] for i in g) for g in groups) == sorted(loads)


def test_pack_beyond_exhaustive_size_is_greedy_and_complete():
    groups = pack([1.0] * 14, 3)
    assert sorted(len(g) for g in groups) == [4, 5, 5]
