"""Pipeline-parallel simulation (paper §4.3) and the TP x PP analytic profiles."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fsd.config import CacheConfig
from fsd.cost import CostModel
from fsd.cost.analytic import GPU_MEMORY_UTILIZATION, derive_terms, plan_stages
from fsd.cost.hardware import GPUS
from fsd.cost.profiles import load_profile, shipped_profiles
from fsd.sched.scheduler import Scheduler
from fsd.sim import SimulationError, Simulator, simulate
from fsd.sim.capacity import size_pools
from fsd.workload import Request, Workload, gamma, length_model, synthetic
from tests.costs import linear_cost
from tests.sim.test_sim_engine import small_cost

MS = 1e-3

# Every iteration takes 1.0 s through the model, whatever it holds: with 2 stages each
# stage is busy 0.5 s per micro-batch. Easy to follow by hand.
IDEAL = linear_cost(
    "ideal", prefill=(1.0, 0.0), decode=(1.0, 0.0, 0.0), kv_bytes_per_token=1000,
    swap_bytes_per_s=1e6, pipeline_stages=2,
)  # fmt: skip
FLAT = replace(IDEAL, pipeline_stages=1)


def burst(n: int, prompt: int = 4, output: int = 5) -> Workload:
    return Workload(tuple(Request(0.0, prompt, output) for _ in range(n)))


def finish_times(result) -> list[float]:
    return [j.finish_time for j in result.jobs]


@pytest.fixture
def spy(monkeypatch):
    """Every schedule() call: (now, the busy ids it was given, the ids it batched)."""
    calls: list[tuple[float, frozenset[str], list[str]]] = []
    real = Scheduler.schedule

    def schedule(self, now, busy=()):
        out = real(self, now, busy)
        calls.append((now, frozenset(busy), [j.job_id for j in out.batch]))
        return out

    monkeypatch.setattr(Scheduler, "schedule", schedule)
    return calls


# ---- hand-computed timelines ------------------------------------------------------------


def test_a_lone_job_is_not_sped_up_by_stages():
    # One job cannot be in two micro-batches: a token per full latency (1.0 s), pp or not.
    w = Workload((Request(0.0, 4, 3),))
    for cost in (IDEAL, FLAT):
        r = simulate(w, cost, "fcfs", num_gpu_blocks=64)
        assert r.jobs[0].ttft == pytest.approx(1.0)
        assert finish_times(r) == pytest.approx([3.0])


def test_two_micro_batches_overlap_and_tokens_arrive_after_two_stage_times(spy):
    # Batch size 1. pp=2: A enters stage 1 at 0, B at 0.5 (A is still in stage 2);
    # A's token arrives at 1.0 = 2 stage times, B's at 1.5; then A 1.0-2.0, B 1.5-2.5.
    w = burst(2, output=2)
    r = simulate(w, IDEAL, "fcfs", max_batch_size=1, num_gpu_blocks=64)
    assert [j.ttft for j in r.jobs] == pytest.approx([1.0, 1.5])
    assert finish_times(r) == pytest.approx([2.0, 2.5])
    assert r.metrics["iterations"] == 4
    started = [(now, busy, ids) for now, busy, ids in spy if ids]
    assert started == [
        (0.0, frozenset(), ["r0"]),
        (0.5, frozenset({"r0"}), ["r1"]),
        (1.0, frozenset({"r1"}), ["r0"]),
        (1.5, frozenset({"r0"}), ["r1"]),
    ]
    # pp=1: FCFS runs A to the end (0-2), then B (2-4).
    flat = simulate(w, FLAT, "fcfs", max_batch_size=1, num_gpu_blocks=64)
    assert finish_times(flat) == pytest.approx([2.0, 4.0])


def test_a_saturated_queue_gets_twice_the_throughput():
    # 4 jobs x 5 tokens, 2 per batch. pp=1: 10 iterations of 1 s. pp=2: {A,B} and {C,D}
    # alternate half a second apart: A,B end at 5.0 and C,D at 5.5.
    w = burst(4, output=5)
    flat = simulate(w, FLAT, "fcfs", max_batch_size=2, num_gpu_blocks=64)
    piped = simulate(w, IDEAL, "fcfs", max_batch_size=2, num_gpu_blocks=64)
    assert finish_times(flat) == pytest.approx([5.0, 5.0, 10.0, 10.0])  # FCFS: A,B then C,D
    assert finish_times(piped) == pytest.approx([5.0, 5.0, 5.5, 5.5])
    # the busy fraction counts stage-1 time (10 micro-batches of 0.5 s): saturated bar the tail
    assert flat.metrics["busy_frac"] == pytest.approx(1.0)
    assert piped.metrics["busy_frac"] == pytest.approx(10 * 0.5 / 5.5)
    # a long saturated run approaches exactly 2x
    long_w = burst(4, output=200)
    t1 = simulate(long_w, FLAT, "fcfs", max_batch_size=2, num_gpu_blocks=256)
    t2 = simulate(long_w, IDEAL, "fcfs", max_batch_size=2, num_gpu_blocks=256)
    ratio = t2.metrics["throughput_tps"] / t1.metrics["throughput_tps"]
    assert ratio == pytest.approx(400 / 200.5)


def test_up_to_pp_micro_batches_in_flight(spy):
    # Plenty of jobs, batch size 1: with 3 stages, micro-batches enter every 1/3 s and
    # each decision sees the other two in flight once the pipeline is full.
    cost = replace(IDEAL, pipeline_stages=3)
    r = simulate(burst(6, output=3), cost, "fcfs", max_batch_size=1, num_gpu_blocks=64)
    starts = [now for now, _busy, ids in spy if ids]
    assert starts[:4] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    assert max(len(busy) for _now, busy, _ids in spy) == 2
    # 18 micro-batches of 1/3 s back to back; the last enters at 17/3 and takes 1 s
    assert max(finish_times(r)) == pytest.approx(17 / 3 + 1)


def test_sync_swaps_hold_every_stage():
    # A forced (reactive) copy costs its swap_time on each stage (each moves its own
    # layers' KV over its own links): stage-1 time = micro-batches x 0.5 s + sync time.
    cost = replace(IDEAL, kv_bytes_per_token=10_000, swap_bytes_per_s=1e9)
    r = simulate(bursty(60), cost, "sj-mlfq", "reactive", num_gpu_blocks=150)
    assert r.metrics["sync_swap_s"] > 0
    busy_stage_s = r.metrics["busy_frac"] * r.metrics["makespan_s"]
    assert busy_stage_s == pytest.approx(r.metrics["iterations"] * 0.5 + r.metrics["sync_swap_s"])


# ---- invariants on realistic runs -----------------------------------------------------------


def bursty(n: int) -> Workload:
    return synthetic(gamma(40.0, 4.0), length_model("sharegpt"), n, seed=3).clipped(1024)


SMALL = small_cost(name="small-pp2", pipeline_stages=2)


@pytest.mark.parametrize("policy", ["fcfs", "sj-mlfq", "srpt"])
@pytest.mark.parametrize("kv", ["recompute", "reactive", "proactive"])
def test_a_job_in_flight_is_never_in_two_micro_batches(spy, policy, kv):
    # Tight KV so that swaps and drops happen while micro-batches are in flight.
    r = simulate(bursty(60), SMALL, policy, kv, num_gpu_blocks=150, max_batch_size=16)
    assert r.metrics["swaps"] + r.metrics["recomputes"] > 0  # KV moved around busy jobs
    in_flight: dict[str, float] = {}  # job -> when its micro-batch entered
    batched = 0
    for now, busy, ids in spy:
        assert not busy & set(ids)
        assert len(ids) == len(set(ids))
        batched += len(ids)
        for job_id in ids:
            # a job's next micro-batch starts no sooner than its last one's latency
            # (at least one full pass through both stages: >= 2 x decode_base / 2)
            assert now - in_flight.get(job_id, -1.0) >= 0.02 - 1e-12
            in_flight[job_id] = now
    assert batched == pytest.approx(r.metrics["iterations"] * r.metrics["mean_batch"])
    assert all(j.num_output_tokens == j.max_output for j in r.jobs)


def test_pipelined_runs_are_deterministic():
    w = bursty(80)
    a = simulate(w, SMALL, "sj-mlfq", num_gpu_blocks=400)
    b = simulate(w, SMALL, "sj-mlfq", num_gpu_blocks=400)
    a.metrics.pop("sim_wall_s")
    b.metrics.pop("sim_wall_s")
    assert a.metrics == b.metrics
    assert finish_times(a) == finish_times(b)


def test_pp1_is_the_unpipelined_loop(spy):
    # With one stage nothing overlaps: no decision ever sees a busy job, and each batch
    # starts when the previous one ends (or later, at an arrival).
    w = bursty(80)
    cost = replace(SMALL, pipeline_stages=1)
    r = simulate(w, cost, "sj-mlfq", num_gpu_blocks=400)
    assert all(not busy for _now, busy, _ids in spy)
    pp1_override = simulate(w, SMALL, "sj-mlfq", num_gpu_blocks=400, pipeline_stages=1)
    for res in (r, pp1_override):
        res.metrics.pop("sim_wall_s")
    assert r.metrics == pp1_override.metrics
    # the same run with two stages does overlap
    spy.clear()
    simulate(w, SMALL, "sj-mlfq", num_gpu_blocks=400)
    assert any(busy for _now, busy, _ids in spy)


def test_pipeline_stages_must_be_a_positive_integer():
    with pytest.raises(SimulationError, match="pipeline_stages"):
        Simulator(IDEAL, pipeline_stages=0)
    with pytest.raises(Exception, match="pipeline_stages"):
        replace(IDEAL, pipeline_stages=0)
    with pytest.raises(Exception, match="pipeline_stages"):
        CostModel.from_dict({"pipeline_stages": 1.5})
    # profiles without the field (older JSONs) load as one stage
    assert CostModel.from_dict({"name": "old"}).pipeline_stages == 1


# ---- the OPT-175B TP 8 x PP 2 profiles -------------------------------------------------------


def test_tp8pp2_profiles_ship_and_load():
    for name in ("opt-175b-a100-tp8pp2", "opt-175b-a100-40gb-tp8pp2"):
        assert name in shipped_profiles()
        cost = load_profile(name)
        assert cost.pipeline_stages == 2
        assert cost.notes["layout"] == {"tp": 8, "pp": 2, "num_gpus": 16, "dtype_bytes": 2}
        assert "16 x" in str(cost.notes["gpus"])
        assert Simulator(cost).pipeline_stages == 2


def test_tp8pp2_stage_is_faster_than_one_node_and_far_faster_than_one_gpu():
    pp2 = load_profile("opt-175b-a100-tp8pp2")
    tp8 = load_profile("opt-175b-a100")
    # a token's latency is one node's worth of model per GPU either way (+ one hop) ...
    assert tp8.min_iteration_time < pp2.min_iteration_time < 1.01 * tp8.min_iteration_time
    # ... but a stage is busy for half of it, so the 16 GPUs decode twice as often
    step = pp2.stage_time([], [1024])
    assert step == pytest.approx(pp2.decode_time(1, 1024) / 2)
    assert step < 0.55 * tp8.decode_time(1, 1024)
    # one GPU (were it big enough) would stream all 349 GB per step: ~8x slower
    tp1 = derive_terms("opt-175b", "a100", tp=1, pp=1)
    assert tp1.decode_base > 6 * pp2.decode_base
    # the paper's "about 60 ms" per step on 16 A100s: within a factor of 2, below it
    paper = load_profile("opt-175b-a100-40gb-tp8pp2")
    assert 30 * MS < paper.decode_time(16, 16 * 1024) < 60 * MS


def test_tp8pp2_kv_lives_per_stage():
    cost = load_profile("opt-175b-a100-tp8pp2")
    stages = plan_stages("opt-175b", "a100", tp=8, pp=2)
    assert [s.layers for s in stages] == [48, 48]
    for s in stages:
        # half the layers, heads/8: 1/16 of the model's KV per token on each GPU
        assert s.kv_bytes_per_token_per_gpu * 16 == cost.kv_bytes_per_token
        assert 21e9 < s.weights_bytes_per_gpu < 22.5e9  # 349 GB / 16 plus an embedding table
        assert s.kv_capacity_tokens > 0
    assert cost.notes["kv_capacity_tokens"] == min(s.kv_capacity_tokens for s in stages)
    budget = GPUS["a100"].memory_bytes * GPU_MEMORY_UTILIZATION
    room = budget - max(s.weights_bytes_per_gpu for s in stages)
    assert cost.notes["kv_capacity_tokens"] == pytest.approx(
        room / (cost.kv_bytes_per_token / 16), abs=1
    )
    # twice the GPUs for the same weights: > 3x the KV room of TP 8 on one node
    assert (
        cost.notes["kv_capacity_tokens"]
        > 3 * load_profile("opt-175b-a100").notes["kv_capacity_tokens"]
    )
    # the paper's 40 GB GPUs leave far less
    paper = load_profile("opt-175b-a100-40gb-tp8pp2")
    assert 0 < paper.notes["kv_capacity_tokens"] < cost.notes["kv_capacity_tokens"] / 3
    pools = size_pools(cost, CacheConfig())
    assert pools.device == cost.notes["kv_capacity_tokens"] // 16


def test_tp8pp2_swaps_over_all_sixteen_links():
    cost = load_profile("opt-175b-a100-tp8pp2")
    assert cost.swap_bytes_per_s == 16 * GPUS["a100"].pcie_bytes_per_s
    assert cost.swap_time(513) == pytest.approx(load_profile("opt-175b-a100").swap_time(513) / 2)


def test_readme_numbers_for_the_tp8pp2_profiles():
    # fsd/cost/profiles/README.md, "TP x PP": latency and stage time in ms, KV room
    for name, q1, stage, room in (
        ("opt-175b-a100-tp8pp2", 31.92, 15.96, 169_861),
        ("opt-175b-a100-40gb-tp8pp2", 39.73, 19.86, 47_790),
    ):
        cost = load_profile(name)
        assert round(cost.min_iteration_time / MS, 2) == q1
        assert round(cost.stage_time([], [1]) / MS, 2) == stage
        assert cost.notes["kv_capacity_tokens"] == room
        assert round(cost.swap_time(513) / MS, 2) == 6.05
