"""Whole simulations with the fast prefix cache (P16) against the plain one it
replaced (tests/kv/prefix_reference.py): a multi-turn trace with prefix hashes on a
small device tier, where waiting jobs are attached and given back every iteration,
copied back from the host and evicted again, must give the same metrics and the
same finish time for every job, for the default policy and two others."""

from __future__ import annotations

import random

import pytest

from fsd.config import CacheConfig, SchedConfig
from fsd.cost.profiles import load_profile
from fsd.sim.engine import Simulator
from fsd.workload.spec import Workload
from tests.kv.prefix_reference import ReferenceBlockManager

COST = load_profile("llama3.1-8b-h100")


def conversations(n: int = 160, seed: int = 7) -> Workload:
    """`n` turns of 24 conversations: each turn's prompt is its conversation so far
    (512-token blocks, as the Mooncake trace's hashes) plus a new question, some
    opening with one of two shared system prompts; bursts keep jobs waiting."""
    rng = random.Random(seed)
    system = [tuple(range(1000, 1000 + rng.randint(2, 6))) for _ in range(2)]
    history: list[tuple[int, ...]] = [system[i % 2] if i % 3 else () for i in range(24)]
    fresh = iter(range(10_000, 1_000_000))
    arrivals, prompts, outputs, hashes = [], [], [], []
    t = 0.0
    for _ in range(n):
        c = rng.randrange(24)
        history[c] = history[c] + tuple(next(fresh) for _ in range(rng.randint(1, 4)))
        if len(history[c]) > 24:  # a long conversation starts over
            history[c] = system[c % 2]
            history[c] += (next(fresh),)
        t += rng.expovariate(4.0)
        arrivals.append(t)
        prompts.append(512 * len(history[c]) - rng.randrange(512))
        outputs.append(rng.randint(1, 300))
        hashes.append(history[c])
    return Workload.from_arrays(arrivals, prompts, outputs, "turns", {}, hashes)


def run(w: Workload, policy: str) -> tuple[dict, list]:
    # a device tier of ~3 long prompts and a small host tier: blocks go down, come
    # back and are dropped all the time
    sim = Simulator(
        COST, SchedConfig(policy=policy), CacheConfig(), num_gpu_blocks=2400,
        num_host_blocks=3000,
    )  # fmt: skip
    result = sim.run(w)
    metrics = {k: v for k, v in result.metrics.items() if k != "sim_wall_s"}
    return metrics, [(j.job_id, j.first_token_time, j.finish_time) for j in result.jobs]


@pytest.mark.parametrize("policy", ["default", "fcfs", "gittins"])
def test_the_fast_cache_simulates_exactly_as_the_plain_one(policy, monkeypatch):
    w = conversations()
    fast = run(w, policy)
    monkeypatch.setattr("fsd.sim.engine.BlockManager", ReferenceBlockManager)
    plain = run(w, policy)
    assert fast == plain
    m = fast[0]
    # what the comparison is for: reuse from both tiers, evictions from both
    assert m["prefix_hit_rate_device"] > 0 and m["prefix_hit_rate_host"] > 0
    assert m["prefix_evictions"] > 0 and m["prefix_host_evictions"] > 0
