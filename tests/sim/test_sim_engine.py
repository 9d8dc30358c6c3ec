"""The simulator: hand-computed timings, determinism, conservation, swaps, policy order."""

from __future__ import annotations

import dataclasses

import pytest

from fsd.config import CacheConfig, SchedConfig
from fsd.cost import CostModel
from fsd.sim import SimulationError, Simulator, simulate
from fsd.sim.loop import _Link
from fsd.workload import Request, Workload, gamma, length_model, poisson, synthetic
from tests.costs import linear_cost

POLICIES = ["fcfs", "priority", "mlfq", "sj-mlfq", "srpt"]
KV = ["defer", "recompute", "reactive", "proactive"]

# prefill(n) = 0.5 + 0.125 n; a decode step = 0.25 whatever the batch (easy to add by hand)
HAND = linear_cost(
    "hand", prefill=(0.5, 0.125), decode=(0.25, 0.0, 0.0), kv_bytes_per_token=1000,
    swap_bytes_per_s=1e6,
)  # fmt: skip
THREE = Workload((Request(0.0, 4, 3), Request(0.5, 4, 2), Request(1.0, 8, 1)))


def small_cost(**kw) -> CostModel:
    base = dict(kv_bytes_per_token=100_000, swap_bytes_per_s=20e9)
    cost = linear_cost("small", prefill=(0.02, 1e-4), decode=(0.02, 1e-4, 1e-7), **base)
    return dataclasses.replace(cost, **kw) if kw else cost


def ptl(result) -> list[float]:
    return [j.per_token_latency for j in result.jobs]


def test_fcfs_batch_one_hand_computed():
    # A: prefill 0-1.0, decodes to 1.5.  B: waits, prefill 1.5-2.5, decode to 2.75.
    # C: prefill(8) = 1.5, 2.75-4.25.  Per-token: 1.5/3, 2.25/2, 3.25/1.
    r = simulate(THREE, HAND, "fcfs", max_batch_size=1, num_gpu_blocks=64)
    assert ptl(r) == pytest.approx([0.5, 1.125, 3.25])
    assert [j.ttft for j in r.jobs] == pytest.approx([1.0, 2.0, 3.25])
    assert r.metrics["avg"] == pytest.approx((0.5 + 1.125 + 3.25) / 3)
    assert r.metrics["iterations"] == 6


def test_fcfs_batched_hand_computed():
    # 0-1.0: A's prefill alone.  1.0-2.75: A decodes while B and C prefill (0.25 + 0.5 + 1.0);
    # C is done.  2.75-3.0: A and B decode; both are done.
    r = simulate(THREE, HAND, "fcfs", max_batch_size=3, num_gpu_blocks=64)
    assert ptl(r) == pytest.approx([3.0 / 3, 2.5 / 2, 1.75 / 1])
    assert r.metrics["tpot"] == pytest.approx(((3.0 - 1.0) / 2 + (3.0 - 2.75) / 1) / 2)
    assert r.metrics["makespan_s"] == pytest.approx(3.0)
    assert r.metrics["mean_batch"] == pytest.approx(6 / 3)


def test_same_inputs_same_results():
    w = synthetic(gamma(4.0, 4.0), length_model("sharegpt"), 150, seed=3)
    kw = dict(num_gpu_blocks=300, num_host_blocks=3000)  # under pressure: swaps happen
    a = simulate(w, small_cost(), "sj-mlfq", **kw).metrics
    b = simulate(w, small_cost(), "sj-mlfq", **kw).metrics
    assert a["swaps"] > 0
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_job_finishes_and_every_block_comes_back(policy, kv):
    w = synthetic(gamma(30.0, 3.0), length_model("alpaca"), 60, seed=1)
    r = simulate(
        w, small_cost(), policy, kv, max_batch_size=6, num_gpu_blocks=40, num_host_blocks=400
    )
    assert all(j.finish_time is not None for j in r.jobs)
    assert [j.num_output_tokens for j in r.jobs] == [q.output_len for q in w]
    blocks = r.scheduler.blocks
    blocks.check()
    assert blocks.device.num_free == 40 and blocks.host.num_free == 400
    assert r.metrics["peak_kv_blocks"] <= 40
    assert all(j.finish_time >= j.first_token_time >= j.arrival_time for j in r.jobs)


def test_small_device_pool_with_proactive_swaps_asynchronously():
    w = synthetic(gamma(40.0, 4.0), length_model("alpaca"), 120, seed=2)
    r = simulate(
        w,
        small_cost(),
        "sj-mlfq",
        "proactive",
        max_batch_size=4,
        num_gpu_blocks=48,
        num_host_blocks=2000,  # room for every started job: nothing needs dropping
    )
    m = r.metrics
    assert m["swaps_out"] > 0 and m["swaps_in"] > 0
    assert m["recomputes"] == 0
    assert m["async_swap_s"] > 0 and m["peak_host_blocks"] > 0


def test_reactive_swaps_sit_on_the_critical_path():
    w = synthetic(gamma(40.0, 4.0), length_model("alpaca"), 120, seed=2)
    r = simulate(w, small_cost(), "sj-mlfq", "reactive", max_batch_size=4, num_gpu_blocks=48)
    assert r.metrics["swaps"] > 0 and r.metrics["sync_swap_s"] > 0


def test_srpt_beats_fcfs_on_a_heavy_tailed_workload():
    w = synthetic(poisson(8.0), length_model("sharegpt"), 120, seed=5)
    fcfs = simulate(w, small_cost(), "fcfs", max_batch_size=8).metrics
    srpt = simulate(w, small_cost(), "srpt", max_batch_size=8).metrics
    assert srpt["avg"] < fcfs["avg"]


def test_idle_gaps_are_skipped_not_stepped():
    w = Workload((Request(0.0, 4, 2), Request(1000.0, 4, 2)))
    r = simulate(w, HAND, "fcfs", num_gpu_blocks=16)
    assert r.metrics["iterations"] == 4
    assert r.jobs[1].finish_time == pytest.approx(1000.0 + 1.0 + 0.25)


def test_kv_series_is_sampled_when_asked():
    w = synthetic(poisson(20.0), length_model("alpaca"), 50, seed=0)
    r = simulate(w, small_cost(), "fcfs", kv_sample_s=0.5, num_gpu_blocks=500)
    assert len(r.kv_series) > 2
    assert all(0 <= dev <= 500 for _, dev, _, _ in r.kv_series)
    assert [t for t, *_ in r.kv_series] == sorted(t for t, *_ in r.kv_series)


def test_requests_that_can_never_run_are_refused_up_front():
    long_prompt = Workload((Request(0.0, 5000, 2),))
    # the engine's admission rule, word for word: whole prefills must fit one iteration
    with pytest.raises(
        SimulationError, match=r"request 0: prompt has 5000 tokens, more than max_batch_tokens"
    ):
        simulate(long_prompt, HAND, "fcfs", prefill_chunk=0)
    chunked = simulate(long_prompt, HAND, "fcfs", prefill_chunk=1024, num_gpu_blocks=400)
    assert chunked.jobs[0].num_output_tokens == 2  # in chunks it runs
    with pytest.raises(
        SimulationError, match="request 0: .* needs 7 KV blocks; the device pool has 4"
    ):
        simulate(Workload((Request(0.0, 100, 10),)), HAND, "fcfs", num_gpu_blocks=4)
    with pytest.raises(SimulationError, match="unknown simulation option"):
        simulate(THREE, HAND, "fcfs", batch=3)


def test_unknown_policy_fails_before_running():
    from fsd.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown policy 'lifo'"):
        Simulator(HAND, SchedConfig(policy="lifo"), CacheConfig())


def test_link_is_fifo_per_direction():
    link = _Link()
    assert link.submit(0.0, 2.0) == 2.0
    assert link.submit(1.0, 1.0) == 3.0  # waits for the first copy
    assert link.submit(10.0, 1.0) == 11.0  # idle link starts at once


def test_a_job_whose_re_prefill_exceeds_the_token_budget_runs_alone_not_never():
    # prompt 60 + output 40 in an 80-token budget: admitted (the engine's rule), and when
    # recompute drops its KV it re-prefills up to 99 tokens at once, alone in its batch
    w = Workload(tuple(Request(0.01 * i, 60, 40) for i in range(6)))
    r = simulate(w, HAND, "mlfq", "recompute", max_batch_tokens=80, num_gpu_blocks=8, block_size=16)
    assert all(j.num_output_tokens == 40 for j in r.jobs)
    assert r.metrics["recomputes"] > 0
