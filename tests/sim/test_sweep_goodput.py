"""Sustainable load (completed >= 97% of offered work) and the P95 goodput sweep."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fsd.cli import app
from fsd.errors import ConfigError
from fsd.sim.job import SimJob
from fsd.sim.metrics import SUSTAINED_FRACTION, job_tpot, joint_attainment, throughput
from fsd.sim.runner import run_one
from fsd.sim.sweep import GOODPUT_QUANTILE, sweep, sweep_all, sweep_targets
from tests.sim.test_sim_sweep import COST, WORK, spec


def served(arrival: float, first: float, gaps: list[float]) -> SimJob:
    """A finished job of len(gaps) + 1 output tokens: the first at `first`, then `gaps`."""
    job = SimJob(f"j{arrival}", arrival, prompt_len=10, output_len=len(gaps) + 1)
    now = first
    job.append_token(0, now)
    for g in gaps:
        now += g
        job.append_token(0, now)
    job.finish_time = now
    return job


# ---- (a) sustainability ----------------------------------------------------------


def test_a_server_at_half_the_arrival_rate_is_unsustainable_though_every_job_ends():
    # one arrival a second, one completion every two: the backlog grows by half the
    # offered rate until the last arrival, then drains; the drain must not count
    jobs = [served(float(i), 2.0 * i + 0.5, [0.1, 0.1]) for i in range(100)]
    t = throughput(jobs)
    assert t.request_ratio == pytest.approx(0.5, abs=0.02)
    assert t.token_ratio == pytest.approx(0.5, abs=0.02)
    assert not t.sustainable


def test_a_server_that_keeps_up_is_sustainable():
    jobs = [served(float(i), i + 0.2, [0.1] * 5) for i in range(100)]
    t = throughput(jobs)
    assert t.ratio == pytest.approx(1.0, abs=0.01) and t.sustainable


def test_a_long_job_served_at_full_speed_at_the_end_is_not_falling_behind():
    # its 500 tokens take 50 s at any load: due one step apart, not all at arrival
    jobs = [served(float(i), i + 0.1, [0.1, 0.1]) for i in range(99)]
    jobs.append(served(99.0, 99.1, [0.1] * 499))
    t = throughput(jobs)
    assert t.ratio == pytest.approx(1.0, abs=0.01) and t.sustainable


def test_starving_the_long_jobs_fails_on_tokens_while_requests_keep_up():
    # SRPT past capacity: every short job is served at once, each long one never until
    # the drain; most requests finish on time, most of the work does not
    jobs = [
        served(float(i), i + 0.1, [0.01] * 2)
        if i % 4
        else served(float(i), 1000.0 + i, [0.01] * 40)
        for i in range(200)
    ]
    t = throughput(jobs)
    assert t.request_ratio > 0.7 and t.token_ratio < 0.3
    assert t.ratio == t.token_ratio and not t.sustainable


def test_one_burst_has_nothing_to_keep_up_with():
    t = throughput([served(0.0, 5.0 * i, [0.1]) for i in range(5)])
    assert t.ratio == 1.0 and t.sustainable


def test_an_overloaded_simulation_is_flagged_and_a_light_one_is_not():
    heavy = run_one(spec("srpt"), COST, WORK.scaled(4.0))
    assert heavy["requests"] == len(WORK)  # the finite run ended...
    assert heavy["avg"] <= 0.05  # ...and its average meets the SLO...
    assert not heavy["sustainable"] and heavy["throughput_ratio"] < 0.8  # ...past capacity
    light = run_one(spec("srpt"), COST, WORK.scaled(0.5))
    assert light["sustainable"] and light["throughput_ratio"] >= SUSTAINED_FRACTION


def test_the_max_rate_stays_under_the_throughput_cap():
    # the cap: requests/s the server completes when flooded (same request mix)
    cap = float(run_one(spec("srpt"), COST, WORK.scaled(16.0))["throughput_rps"])
    r = sweep(spec("srpt"), COST, WORK, tol=0.1)
    assert r.bracketed and 0 < r.max_rate <= cap
    assert r.metrics is not None and r.metrics["sustainable"]
    # what the old sweep took as feasible: the SLO met past the cap, by a run that ends
    fooled = [p for p in r.points if p["avg"] <= 0.05 and not p["sustainable"]]
    assert all(not p["feasible"] for p in fooled) and max(p["rate"] for p in fooled) > cap


# ---- (b) P95 goodput ---------------------------------------------------------------


def test_joint_attainment_counts_jobs_meeting_both_bounds():
    jobs = [
        served(0.0, 0.5, [0.1, 0.1]),  # ttft 0.5, tpot 0.1: meets both
        served(0.0, 2.0, [0.1, 0.1]),  # ttft 2.0: fails TTFT
        served(0.0, 0.5, [0.1, 0.5]),  # tpot 0.3: fails TPOT (a mean, not the worst gap)
        served(0.0, 1.0, []),  # one token: no TPOT, TTFT 1.0 meets its bound
        served(0.0, 0.25, [0.25, 0.25]),  # tpot 0.25: exactly at the bound meets it
    ]
    assert [job_tpot(j) for j in jobs] == pytest.approx([0.1, 0.1, 0.3, None, 0.25])
    assert joint_attainment(jobs, ttft_slo=1.0, tpot_slo=0.25) == pytest.approx(3 / 5)
    assert joint_attainment(jobs, ttft_slo=10.0, tpot_slo=1.0) == 1.0
    assert joint_attainment(jobs, ttft_slo=0.1, tpot_slo=1.0) == 0.0


@pytest.mark.parametrize("policy", ["fcfs", "srpt"])
def test_goodput95_is_sustainable_and_at_most_the_max_sustainable_rate(policy):
    # a huge SLO leaves sustainability as the max-rate target's only test
    tol = 0.1
    found = sweep_targets(spec(policy, slo=1e6), COST, WORK, tol=tol)
    bound, good = found["slo"], found["goodput95"]
    assert good.reference is not None and good.reference.scale == pytest.approx(1 / 20)
    assert good.reference.ttft_slo == pytest.approx(10 * good.reference.ttft)
    assert good.reference.tpot_slo == pytest.approx(10 * good.reference.tpot)
    assert 0 < good.max_rate <= bound.max_rate * (1 + tol)
    assert good.metrics is not None and good.metrics["joint_attainment"] >= GOODPUT_QUANTILE
    for p in good.points:
        ok = p["sustainable"] and p["joint_attainment"] >= GOODPUT_QUANTILE
        assert p["feasible"] == ok


def test_every_policy_is_judged_against_one_fcfs_reference():
    found = sweep_all([spec("srpt"), spec("sj-mlfq")], COST, WORK, tol=0.2, targets=("goodput95",))
    refs = {r["goodput95"].reference for r in found.values()}
    assert len(refs) == 1 and None not in refs


def test_unknown_target_is_refused():
    with pytest.raises(ConfigError, match="sweep targets"):
        sweep(spec("fcfs"), COST, WORK, target="p99goodput")


# ---- (c) the command ---------------------------------------------------------------


def test_sweep_command_prints_and_writes_goodput_and_sustainability(tmp_path):
    out = tmp_path / "sweep.json"
    args = ["simulate", "--rate", "4", "--limit", "150", "--policies", "fcfs,srpt"]
    r = CliRunner().invoke(app, [*args, "--sweep", "--sweep-tol", "0.3", "--json", str(out)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "P95 goodput r/s" in text and "sustainable" in text and "P95 goodput reference" in text
    data = json.loads(out.read_text())
    light = data["sweep"]["goodput95"]["light_load"]
    assert light["ttft_slo"] == pytest.approx(10 * light["ttft"])
    for row in data["policies"].values():
        assert 0 < row["goodput95"]["max_rate"] <= row["max_rate"] * 1.3
        for p in row["points"] + row["goodput95"]["points"]:
            assert isinstance(p["sustainable"], bool) and "throughput_ratio" in p
            assert p["sustainable"] or not p["feasible"]


def test_no_sweep_goodput_keeps_the_max_rate_alone(tmp_path):
    out = tmp_path / "sweep.json"
    args = ["simulate", "--rate", "4", "--limit", "100", "--policies", "fcfs", "--sweep"]
    r = CliRunner().invoke(app, [*args, "--no-sweep-goodput", "--json", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert "goodput95" not in data["sweep"] and "goodput95" not in data["policies"]["fcfs"]
    assert data["policies"]["fcfs"]["max_rate"] > 0
