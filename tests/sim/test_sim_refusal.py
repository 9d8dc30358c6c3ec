"""Overload refusal in the simulator (refuse_wait, off by default): the engine's rule
(fsd.admission.refuse_late) on each arrival; a refused job is counted, never served."""

from __future__ import annotations

import pytest

from fsd.config import CacheConfig, SchedConfig
from fsd.sim.runner import RunSpec
from fsd.workload import length_model, poisson, synthetic
from tests.costs import linear_cost

COST = linear_cost("s", prefill=(0.02, 1e-4), decode=(0.02, 5e-4, 1e-7))
# about 4x what a batch of 8 keeps up with: the queue before the first token grows
WORK = synthetic(poisson(8.0), length_model("decode-heavy"), 300, seed=3)


def run(refuse_wait: float | None):
    spec = RunSpec(
        "fsd",
        SchedConfig(policy="fsd", max_batch_size=8, refuse_wait=refuse_wait),
        CacheConfig(),
        num_gpu_blocks=4000,
    )
    sim = spec.simulator(COST)
    result = sim.run(WORK)
    return result, sim


def test_past_capacity_a_bounded_wait_refuses_some_and_the_taken_start_sooner():
    off, _ = run(None)
    on, _ = run(10.0)
    m0, m1 = off.metrics, on.metrics
    assert m0["refused"] == 0 and m0["requests"] == len(WORK.requests)
    assert 0 < m1["refused"] < len(WORK.requests)
    assert m1["requests"] + m1["refused"] == len(WORK.requests)
    assert m1["refused_frac"] == pytest.approx(m1["refused"] / len(WORK.requests))
    assert m0["ttft"] > 20.0  # without refusal the wait grows past the bound
    assert m1["ttft"] < m0["ttft"] / 2
    # the refused count as missed: attainment is over every arrival
    assert m1["slo_attainment"] <= (m1["requests"]) / len(WORK.requests)


def test_a_refused_job_never_ran_and_a_taken_one_finished():
    on, _ = run(10.0)
    jobs = on.jobs
    refused = [j for j in jobs if j.refused]
    assert refused
    assert all(j.output_count == 0 and j.finish_time is None for j in refused)
    assert all(j.finish_time is not None for j in jobs if not j.refused)


def test_a_bound_never_reached_changes_nothing():
    off, _ = run(None)
    loose, _ = run(86400.0)
    keys = ("avg", "p95", "ttft", "tbt_p99", "preemptions", "swaps", "iterations")
    assert {k: loose.metrics[k] for k in keys} == {k: off.metrics[k] for k in keys}
    assert loose.metrics["refused"] == 0
