"""Replicas behind a router in the simulator (fsd.sim.replicas): one replica is the
plain simulator exactly, whatever the router; on conversations that share prefixes
the cache-aware and fsd routers keep them together more than round-robin."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from fsd.config import CacheConfig, ClusterConfig, SchedConfig
from fsd.cost.profiles import load_profile
from fsd.router.registry import ROUTERS
from fsd.sim.engine import Simulator
from fsd.sim.replicas import ReplicaSimulator
from fsd.sim.runner import RunSpec, run_many
from fsd.workload.mooncake import read_mooncake
from fsd.workload.spec import Workload
from fsd.workload.trace import read_trace

TRACES = Path(__file__).resolve().parents[2] / "scenarios" / "traces"
OPT = load_profile("opt-13b-a100")


def same(a: dict, b: dict) -> dict:
    """The metrics that differ between two rows (NaN equals NaN; wall time aside)."""
    return {
        k: (a[k], b.get(k))
        for k in a
        if k != "sim_wall_s"
        and a[k] != b.get(k)
        and not (isinstance(a[k], float) and math.isnan(a[k]) and math.isnan(b.get(k, 0.0)))
    }


def conversations(n: int = 30, turns: int = 4, gap: float = 3.0) -> Workload:
    """`n` conversations of `turns` turns; a turn's prompt is its conversation so far
    (64-token prefix blocks: each turn repeats the last one's and adds four)."""
    times, prompts, outputs, hashes = [], [], [], []
    for c in range(n):
        for k in range(turns):
            prompt = 256 * (k + 1) + 20
            times.append(0.4 * c + gap * k)
            prompts.append(prompt)
            outputs.append(24)
            hashes.append(tuple(1000 * c + j for j in range(prompt // 64)))
    return Workload.from_arrays(times, prompts, outputs, "chats", {"hash_block": 64}, hashes)


@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_is_the_plain_simulator_whatever_the_router(router):
    w = read_trace(TRACES / "azure-llm-2023-conv.csv", time_scale=0.5, limit=250).clipped(2048)
    plain = Simulator(OPT, SchedConfig(), CacheConfig()).run(w)
    one = ReplicaSimulator(
        OPT, SchedConfig(), CacheConfig(), cluster=ClusterConfig(router=router)
    ).run(w)
    assert not same(plain.metrics, one.metrics)
    assert [j.finish_time for j in plain.jobs] == [j.finish_time for j in one.jobs]
    assert one.metrics["replicas"] == 1 and one.metrics["migrations"] == 0


def test_one_replica_is_the_plain_simulator_with_prefixes_and_a_pipeline():
    cost = load_profile("llama3.1-8b-h100")
    w = read_mooncake(TRACES / "mooncake-conversation.jsonl", time_scale=0.3, limit=120)
    cfg = SchedConfig(policy="gittins")
    plain = Simulator(cost, cfg, CacheConfig(), pipeline_stages=2).run(w)
    one = ReplicaSimulator(
        cost, cfg, CacheConfig(), cluster=ClusterConfig(), pipeline_stages=2
    ).run(w)
    assert plain.metrics["prefill_tokens_saved"] > 0
    assert not same(plain.metrics, one.metrics)


def test_routers_that_see_the_caches_keep_conversations_together():
    w = conversations()
    split = {}
    for router in ("round-robin", "cache-aware", "fsd"):
        sim = ReplicaSimulator(
            OPT, SchedConfig(), CacheConfig(), cluster=ClusterConfig(replicas=2, router=router)
        )
        m = sim.run(w).metrics
        assert m["requests"] == len(w) and m["same_prefix_requests"] == 30 * 3
        split[router] = m["split_share"]
        hit = m["prefix_hit_rate"]
        assert hit == pytest.approx(m["prefix_hit_rate_device"] + m["prefix_hit_rate_host"], 0.2)
    assert split["round-robin"] > 0.4
    assert split["cache-aware"] < split["round-robin"] / 2
    assert split["fsd"] < split["round-robin"] / 2


def test_run_many_runs_replicas_and_reports_the_spread():
    w = read_trace(TRACES / "azure-llm-2023-conv.csv", time_scale=1.0, limit=200).clipped(2048)
    base = RunSpec("base", SchedConfig(), CacheConfig())
    specs = [base.with_router(r, replicas=3) for r in ("fsd", "least-loaded")]
    specs.append(
        replace(specs[0], label="lazy", cluster=replace(specs[0].cluster, push_interval=0.5))
    )
    rows = run_many(specs, OPT, w)
    for label, row in rows.items():
        assert row["requests"] == 200 and row["replicas"] == 3, label
        assert row["router"] in ("fsd", "least-loaded")
        assert row["busy_cv"] >= 0 and row["queue_max_mean"] >= 1.0
        assert row["router_decision_us"] > 0 and row["migrations"] == 0
    assert specs[0].cluster.replicas == 3 and specs[1].cluster.router == "least-loaded"


def test_the_rebalancer_moves_waiting_jobs_to_an_idle_replica_and_every_job_finishes():
    """A burst routed round-robin onto replicas of very different luck: one gets every
    long job (even positions) and is still busy when the other has nothing left; the
    daemon's rule moves waiting jobs over (fsd.router.rebalance), none is lost."""
    n = 40
    times = [0.0] * n
    prompts = [1800 if i % 2 == 0 else 40 for i in range(n)]
    outputs = [400 if i % 2 == 0 else 4 for i in range(n)]
    burst = Workload.from_arrays(times + [30.0], prompts + [40], outputs + [4], "burst", {})
    sched = SchedConfig(policy="fcfs", max_batch_size=2)
    cluster = ClusterConfig(replicas=2, router="round-robin")
    res = ReplicaSimulator(OPT, sched, CacheConfig(), cluster=cluster).run(burst)
    assert res.metrics["migrations"] > 0
    assert len(res.jobs) == n + 1 and all(j.finish_time is not None for j in res.jobs)
