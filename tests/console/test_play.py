"""`fsctl play` against a real daemon, the statistics of its records, and the bench's
max-rate-under-SLO arithmetic."""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsd.console.cli import app
from fsd.console.play_stats import JobRecord, split_latency, summarize
from tests.server.daemon_proc import SMALL_POOL, SMALL_SCENARIO, Daemon, daemon_fixture

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import slo  # noqa: E402  (bench/slo.py)

CONFIG = SMALL_POOL

# Poisson arrivals, a burst at 0.5 s and a retune at 1.0 s
SCENARIO = SMALL_SCENARIO + '[[event]]\nat = 1.0\nkind = "retune"\nset = { quantum_ratio = 3.0 }\n'


daemon = daemon_fixture(CONFIG, "play")


def fsctl(d: Daemon, *args: str):
    """fsctl as the daemon's operator (its state folder holds the token a retune needs)."""
    base = ["--endpoint", d.endpoint, "--telemetry-endpoint", d.telemetry, "--timeout", "5"]
    base += ["--state-dir", str(d.state_dir)]
    return CliRunner().invoke(app, [*base, *args])


def test_play_writes_a_record_per_job_and_prints_the_summary(daemon, tmp_path):
    scenario = tmp_path / "mini.toml"
    scenario.write_text(SCENARIO)
    records, report = tmp_path / "rec.jsonl", tmp_path / "sum.json"
    res = fsctl(
        daemon,
        "play",
        str(scenario),
        "--records",
        str(records),
        "--json",
        str(report),
        "--no-progress",
        "--time-scale",
        "2",
    )
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    from fsd.workload.scenario import load_scenario
    from fsd.workload.timeline import expand

    timeline = expand(load_scenario(scenario).scaled(time_scale=2.0))
    assert len(lines) == len(timeline.arrivals)
    assert [r["scheduled"] for r in lines] == pytest.approx([a.time for a in timeline.arrivals])
    for r, a in zip(lines, timeline.arrivals, strict=True):
        assert r["reason"] == "length" and r["tokens"] == a.output_len == r["output_len"]
        assert r["ttft"] > 0 and r["per_token_latency"] > 0 and r["job_id"]
        assert r["queuing"] >= 0 and r["execution"] > 0
        assert r["queuing"] + r["execution"] + r["swapping"] == pytest.approx(r["latency"])
    summary = json.loads(report.read_text())
    assert summary["summary"]["finished"] == len(lines)
    assert summary["actions"] == [
        {
            "at": pytest.approx(0.5, abs=0.5),
            "kind": "retune",
            "changes": {"quantum_ratio": 3.0},
            "ok": True,
        }
    ]
    assert summary["kv_series"] and summary["summary"]["slo"] > 0
    assert "avg ms/tok" in res.output and "latency split: queuing" in res.output
    with daemon.client() as c:
        status = c.status()
    assert status.jobs == 0
    # the context the player clips each job to, as the injector and the simulator do
    assert status.max_model_len == 2048


def test_abort_all_ends_the_players_live_jobs(daemon, tmp_path):
    scenario = tmp_path / "abort.toml"
    scenario.write_text(
        '[scenario]\nname = "ab"\nduration = 1.0\n'
        '[[phase]]\narrival = "uniform"\nrate = 2.0\nlengths = { prompt = 8, output = 4 }\n'
        '[[event]]\nat = 0.0\nkind = "burst"\ncount = 3\nprompt_len = 16\noutput_len = 500\n'
        '[[event]]\nat = 0.4\nkind = "abort-all"\n'
    )
    records = tmp_path / "ab.jsonl"
    res = fsctl(daemon, "play", str(scenario), "--records", str(records), "--no-progress")
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    burst = [r for r in lines if r["origin"] == "burst@0s"]
    assert len(burst) == 3 and all(r["reason"] == "abort" for r in burst)
    assert all(r["reason"] == "length" for r in lines if r["origin"] != "burst@0s")
    assert "abort-all at 0.4 s" in res.output


def test_a_bad_scenario_fails_before_playing(daemon, tmp_path):
    scenario = tmp_path / "bad.toml"
    scenario.write_text(SCENARIO.replace("rate = 8.0", "rate = 0"))
    res = fsctl(daemon, "play", str(scenario), "--no-progress")
    assert res.exit_code == 2
    assert "bad.toml: phase[0].rate: must be > 0, got 0" in res.output


def test_no_daemon_is_one_error_line(tmp_path):
    scenario = tmp_path / "mini.toml"
    scenario.write_text(SCENARIO)
    res = CliRunner().invoke(
        app,
        [
            "--endpoint",
            "tcp://127.0.0.1:9",
            "--timeout",
            "0.5",
            "play",
            str(scenario),
            "--no-progress",
            "--records",
            str(tmp_path / "r.jsonl"),
        ],
    )
    assert res.exit_code == 2 and "no fsd daemon answered" in res.output
    assert not (tmp_path / "r.jsonl").exists()


def record(i: int, arrival: float, times: list[float], reason: str = "length") -> JobRecord:
    r = JobRecord(i, "p", arrival, 4, len(times), job_id=f"j{i}", reason=reason)
    r.arrival, r.tokens, r.token_times = arrival, len(times), times
    r.first_token, r.finish = times[0], times[-1]
    return r


def test_summary_statistics_of_hand_made_records():
    a = record(0, 0.0, [0.1, 0.2, 0.3, 0.4])  # 0.1 s/token
    b = record(1, 1.0, [1.5, 1.6, 2.0, 3.0])  # 0.5 s/token
    c = record(2, 2.0, [2.1], reason="abort")
    s = summarize([a, b, c], slo=0.2)
    assert s["jobs"] == 3 and s["finished"] == 2 and s["aborted"] == 1
    assert s["avg"] == pytest.approx(0.3) and s["slo_attainment"] == 0.5
    assert s["ttft"] == pytest.approx((0.1 + 0.5) / 2)
    assert s["tpot"] == pytest.approx((0.1 + 0.5) / 2)
    assert s["itl"] == pytest.approx((0.1 + 0.1 + 0.1 + 0.1 + 0.4 + 1.0) / 6)
    assert s["makespan_s"] == pytest.approx(3.0) and s["goodput"] == pytest.approx(1 / 3)
    assert math.isnan(summarize([], slo=0.2)["avg"])


def test_latency_split_charges_iterations_and_swap_ins():
    r = record(0, 0.0, [0.5, 0.6, 1.0])  # latency 1.0
    iterations = {0.5: 0.2, 0.6: 0.1, 1.0: 0.1, 0.8: 0.2}  # end -> duration
    split_latency([r], iterations, {"j0": 0.15})
    assert r.execution == pytest.approx(0.4) and r.swapping == pytest.approx(0.15)
    assert r.queuing == pytest.approx(0.45)
    s = summarize([r], slo=1.0)
    assert s["queuing_frac"] + s["execution_frac"] + s["swapping_frac"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("lat", "expected"),
    [
        ([0.01, 0.02, 0.05, 0.2], (2.0 + (0.03 - 0.02) / (0.05 - 0.02), True)),
        ([0.01, 0.02, 0.025, 0.029], (4.0, False)),
        ([0.5, 0.6, 0.7, 0.8], (0.0, False)),
        ([0.01, float("nan"), 0.01, 0.01], (1.0, True)),
    ],
)
def test_max_rate_under_the_slo(lat, expected):
    runs = [{"rate": float(i + 1), "avg": x} for i, x in enumerate(lat)]
    got = slo.max_rate_under(runs, slo=0.03, metric="avg")
    assert (got["max_rate"], got["bracketed"]) == (pytest.approx(expected[0]), expected[1])


def test_bench_slo_without_out_writes_a_new_file_not_the_committed_results(tmp_path, monkeypatch):
    # the committed bench/results/slo-cpu.* (which the README shows) must survive a trial run
    committed = tmp_path / "bench" / "results" / "slo-cpu.json"
    committed.parent.mkdir(parents=True)
    committed.write_text('{"committed": true}\n')
    report = {"machine": {"device": "cpu"}, "policies": {}}
    monkeypatch.setattr(slo, "run", lambda bench, console: report)  # no daemons here
    monkeypatch.chdir(tmp_path)
    scenario = tmp_path / "mini.toml"
    scenario.write_text(SCENARIO)
    for _ in range(2):  # two runs in the same second get two files
        slo.main(["--scenario", str(scenario), "--rates", "1", "--no-plots"])
    assert committed.read_text() == '{"committed": true}\n'
    written = sorted(p.name for p in tmp_path.glob("slo-cpu-*.json"))
    assert len(written) == 2 and all(json.loads((tmp_path / n).read_text()) == report for n in written)  # fmt: skip
    assert re.fullmatch(r"slo-cpu-\d{8}-\d{6}(-2)?\.json", written[0])
    # the name says when: slo-DEVICE-YYYYmmdd-HHMMSS, then -2, -3 when taken
    base = slo.default_prefix("cpu", 0.0, tmp_path)
    assert base.name == "slo-cpu-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(0.0))
    base.with_name(base.name + ".json").write_text("{}")
    assert slo.default_prefix("cpu", 0.0, tmp_path).name == base.name + "-2"
