"""The simulator's prefix cache: a trace's prefix-block hashes become reused blocks,
traces without hashes simulate exactly as before, and the reuse never beats the
unbounded-cache bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsd.config import CacheConfig, SchedConfig
from fsd.cost.profiles import load_profile
from fsd.sim.engine import Simulator
from fsd.sim.job import SimJob
from fsd.workload.mooncake import read_mooncake
from fsd.workload.spec import Workload

MOONCAKE = (
    Path(__file__).resolve().parents[2] / "scenarios" / "traces" / "mooncake-conversation.jsonl"
)
COST = load_profile("llama3.1-8b-h100")


def simulate(w: Workload, on: bool, **kw) -> dict:
    sim = Simulator(COST, SchedConfig(), CacheConfig(prefix_cache=on), **kw)
    return sim.run(w).metrics


def test_a_block_is_named_by_the_trace_block_holding_its_last_token():
    job = SimJob("a", 0.0, 1100, 5, prefix_hashes=(7, 8, 9))
    assert job.block_content(0, 16) == (7, 0)
    assert job.block_content(31, 16) == (7, 31)  # tokens 496..511: still the first block
    assert job.block_content(32, 16) == (8, 32)
    assert job.block_content(67, 16) == (9, 67)  # tokens 1072..1087
    assert job.block_content(68, 16) is None  # 1088..1103 passes the prompt's end
    assert SimJob("b", 0.0, 600, 5).block_content(0, 16) is None  # no hashes: no reuse


def test_a_later_turn_reuses_its_conversation_and_starts_sooner():
    # turn 2 repeats turn 1's 4 blocks (2048 tokens) and adds one; 60 s apart
    w = Workload.from_arrays(
        [0.0, 60.0], [2048, 2500], [8, 8], "two turns", {}, [(1, 2, 3, 4), (1, 2, 3, 4, 5)]
    )
    on, off = simulate(w, True), simulate(w, False)
    assert on["prefill_tokens_saved"] == 2048
    assert on["prefix_hit_rate"] == pytest.approx(2048 / 4548)
    assert on["prefix_hit_rate_host"] == 0.0
    assert on["ttft"] < off["ttft"] and off["prefill_tokens_saved"] == 0


def test_a_trace_without_hashes_simulates_exactly_as_with_the_cache_off():
    w = Workload.from_arrays(
        [0.0, 0.1, 0.2, 0.3], [3000, 3000, 500, 9000], [50, 20, 80, 5], "plain", {}
    )
    on, off = simulate(w, True), simulate(w, False)
    skip = {"sim_wall_s", "prefix_cache"}
    assert {k: v for k, v in on.items() if k not in skip} == {
        k: v for k, v in off.items() if k not in skip
    }


def test_blocks_evicted_from_a_small_device_come_back_from_the_host():
    w = Workload.from_arrays(
        [0.0, 30.0, 60.0], [4096, 4096, 4200], [4, 4, 4], "evict", {},
        [tuple(range(8)), tuple(range(100, 108)), tuple(range(8)) + (9,)],
    )  # fmt: skip
    # 300 device blocks (4800 tokens): the second prompt evicts the first's blocks
    m = simulate(w, True, num_gpu_blocks=300, num_host_blocks=1000)
    assert m["prefix_hit_rate_host"] > 0 and m["prefix_evictions"] > 0
    assert m["prefill_tokens_saved"] == 4096


def test_mooncake_reuse_stays_under_the_unbounded_bound():
    w = read_mooncake(MOONCAKE, 0.2, 300)
    seen: set = set()
    bound = total = 0
    for i, r in enumerate(w):
        total += r.prompt_len
        job = SimJob("x", 0.0, r.prompt_len, 1, w.prefix_of(i))
        k = 0
        while (c := job.block_content(k, 16)) is not None:
            bound += 16 * (c in seen)
            seen.add(c)
            k += 1
    m = simulate(w, True)
    assert 0 < m["prefix_hit_rate"] <= bound / total


def test_the_cache_copies_a_prefix_back_only_for_a_job_that_runs(monkeypatch):
    # a small device under overload: most waiting jobs are considered and passed over,
    # each with a prefix cached on the host; only a job in the batch may have its
    # blocks copied back (before, each one considered was, then given back)
    from fsd.sched.scheduler import Scheduler

    checked = {"in": 0, "iterations": 0}
    schedule = Scheduler.schedule

    def checking(self, now, *a, **k):
        out = schedule(self, now, *a, **k)
        ran = {b for job in out.batch for b in job.block_table}
        for op in out.cache_copies:
            if op.direction in ("in", "copy"):
                assert set(op.dst) <= ran, "a block copied back for a job that does not run"
                checked["in"] += len(op.dst)
        checked["iterations"] += 1
        return out

    monkeypatch.setattr(Scheduler, "schedule", checking)
    w = read_mooncake(MOONCAKE, 1.0, 200).clipped(16000)  # prompts of up to 16k tokens
    m = simulate(w, True, num_gpu_blocks=3000, num_host_blocks=20000)
    assert m["prefix_hit_rate_host"] > 0  # host blocks did come back
    assert checked["in"] > 0 and checked["iterations"] > 100
