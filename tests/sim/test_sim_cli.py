"""`fsd simulate` as a user runs it: tables, JSON, sweeps, and one-line errors with exit 2."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fsd.cli import app
from fsd.sim.metrics import HEADLINE
from fsd.sim.records import COLUMNS

TRACE = Path(__file__).resolve().parents[2] / "scenarios" / "traces" / "azure-llm-2023-conv.csv"


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """The first 120 requests of the conversation trace (scenarios/traces)."""
    path = tmp_path / "conv.csv"
    lines = TRACE.read_text().splitlines()[:121]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(*args: str):
    return CliRunner().invoke(app, ["simulate", *args])


def test_trace_run_prints_a_table_and_writes_every_key(small_trace, tmp_path):
    out = tmp_path / "res" / "sim.json"
    r = run(
        "--trace", str(small_trace), "--time-scale", "0.5",
        "--policies", "fcfs,fsd,srpt,default", "--json", str(out),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "fcfs" in r.stdout and "srpt" in r.stdout and "SLO" in r.stdout
    data = json.loads(out.read_text())
    assert list(data["policies"]) == ["fcfs", "fsd", "srpt", "default"]
    for row in data["policies"].values():
        assert set(row) >= set(HEADLINE)
        assert row["requests"] == 120
    assert data["workload"]["time_scale"] == 0.5
    assert data["max_context"] == 2048 and data["profile"] == "opt-13b-a100"
    assert data["policies"]["default"]["avg"] == data["policies"]["fsd"]["avg"]


def test_each_policys_run_shows_its_progress_on_stderr_when_not_a_terminal(small_trace):
    r = run("--trace", str(small_trace), "--policies", "fcfs,srpt")
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    for policy in ("fcfs", "srpt"):
        assert f"simulating {policy}: 0/120" in lines
        assert any(ln.startswith(f"simulating {policy}: done 120/120 in ") for ln in lines)
    assert "simulating" not in r.stdout  # the table's stream stays clean


def test_synthetic_bursty_workload_with_settings(tmp_path):
    out = tmp_path / "syn.json"
    r = run(
        "--arrival", "gamma", "--rate", "2", "--cv", "4", "--lengths", "alpaca",
        "--limit", "150", "--policies", "sj-mlfq", "--kv-policy", "reactive",
        "--policy-settings", "sj-mlfq.promote=entry", "--policy-settings", "sj-mlfq.alpha=2",
        "--num-gpu-blocks", "64", "--max-batch-size", "8",
        "--seed", "3", "--kv-sample", "1.0", "--json", str(out),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    row = data["policies"]["sj-mlfq"]
    assert row["num_gpu_blocks"] == 64 and row["kv_policy"] == "reactive"
    settings = dict(map(tuple, data["sched"]["policy_settings"]))
    assert settings == {"sj-mlfq.alpha": "2", "sj-mlfq.promote": "entry"}
    assert data["workload"]["cv"] == 4.0
    assert row["kv_series"] and len(row["kv_series"][0]) == 4


def test_sweep_reports_each_policys_max_rate(small_trace, tmp_path):
    out = tmp_path / "sweep.json"
    r = run(
        "--trace", str(small_trace), "--policies", "fcfs,srpt", "--sweep", "--sweep-tol", "0.3",
        "--slo", "0.06", "--jobs", "2", "--json", str(out),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    for row in data["policies"].values():
        assert row["max_rate"] > 0 and row["avg"] <= data["slo"]
        assert row["max_time_scale"] == pytest.approx(row["max_scale"])
        infeasible = [p["scale"] for p in row["points"] if not p["feasible"]]
        assert row["bracketed"] == bool(infeasible)
    fcfs = data["policies"]["fcfs"]
    infeasible = [p["scale"] for p in fcfs["points"] if not p["feasible"]]
    assert fcfs["bracketed"] and min(infeasible) <= fcfs["max_scale"] * 1.3 + 1e-9
    assert data["policies"]["srpt"]["max_rate"] >= fcfs["max_rate"]


def test_prefill_chunk_reaches_the_scheduler_and_tbt_the_report(tmp_path):
    out = tmp_path / "chunk.json"
    args = ["--lengths", "prefill-heavy", "--rate", "4", "--limit", "80", "--policies", "fcfs"]
    r = run(*args, "--prefill-chunk", "256", "--json", str(out))
    assert r.exit_code == 0, r.output
    assert "prefill chunks of 256 tokens" in " ".join(r.stdout.split())
    assert "tbt p99 ms" in r.stdout
    chunked = json.loads(out.read_text())
    assert chunked["sched"]["prefill_chunk"] == 256
    row = chunked["policies"]["fcfs"]
    for key in ("tbt_mean", "tbt_p50", "tbt_p99", "tbt_max", "ttft_p99"):
        assert row[key] > 0, key
    assert row["tbt_p50"] <= row["tbt_p99"] <= row["tbt_max"]
    r = run(*args, "--prefill-chunk", "0", "--json", str(out))
    assert r.exit_code == 0, r.output
    whole = json.loads(out.read_text())
    assert whole["sched"]["prefill_chunk"] == 0 and "prefill whole" in r.stdout
    r = run(*args)  # the default: a budget derived from the SLO
    assert r.exit_code == 0, r.output
    assert "tokens (from the SLO)" in " ".join(r.stdout.split())
    # a prefill split into chunks takes more iterations than one that is not
    assert row["iterations"] > whole["policies"]["fcfs"]["iterations"]


def test_jobs_csv_records_every_job_that_the_metrics_summarize(tmp_path):
    out, records = tmp_path / "sim.json", tmp_path / "jobs"
    args = ["--arrival", "gamma", "--rate", "20", "--cv", "4", "--limit", "150"]
    args += ["--num-gpu-blocks", "300", "--policies", "fcfs,sj-mlfq", "--jobs", "2"]
    r = run(*args, "--jobs-csv", str(records), "--json", str(out))
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    ids = None
    for name, row in data["policies"].items():
        assert row["jobs_csv"] == str(records / f"{name}.csv")
        with open(records / f"{name}.csv", newline="") as f:
            jobs = list(csv.DictReader(f))
        assert tuple(jobs[0]) == COLUMNS and len(jobs) == 150
        ids = ids or {j["job_id"] for j in jobs}
        assert {j["job_id"] for j in jobs} == ids  # the same requests under each policy
        arrivals = [float(j["arrival_s"]) for j in jobs]
        assert arrivals == sorted(arrivals)
        per_token = np.array([float(j["per_token_s"]) for j in jobs])
        for j in jobs:
            latency = float(j["finish_s"]) - float(j["arrival_s"])
            assert float(j["latency_s"]) == pytest.approx(latency)
            assert float(j["per_token_s"]) == pytest.approx(latency / int(j["output_tokens"]))
            assert 0 < float(j["ttft_s"]) <= latency + 1e-12
            assert 0 <= float(j["tbt_max_s"]) <= latency - float(j["ttft_s"]) + 1e-12
        assert per_token.mean() == pytest.approx(row["avg"])
        assert np.percentile(per_token, 95) == pytest.approx(row["p95"])
        for key in ("preemptions", "swaps_out", "swaps_in", "recomputes", "promotions"):
            assert sum(int(j[key]) for j in jobs) == row[key], key
        swaps = sum(int(j["swaps_out"]) + int(j["swaps_in"]) for j in jobs)
        assert row["swaps_per_request"] == pytest.approx(swaps / len(jobs))
        preempted = sum(int(j["preemptions"]) for j in jobs)
        assert row["preemptions_per_request"] == pytest.approx(preempted / len(jobs))
    # the small device pool made sj-mlfq swap, so the records are not all zeros
    assert data["policies"]["sj-mlfq"]["swaps_out"] > 0
    assert data["policies"]["sj-mlfq"]["swaps_per_request"] > 0


def test_refuse_wait_reports_the_refused_and_records_only_the_served(tmp_path):
    out, records = tmp_path / "sim.json", tmp_path / "jobs"
    args = ["--arrival", "poisson", "--rate", "20", "--lengths", "decode-heavy"]
    args += ["--limit", "300", "--max-batch-size", "8", "--policies", "fcfs"]
    r = run(*args, "--refuse-wait", "5", "--jobs-csv", str(records), "--json", str(out))
    assert r.exit_code == 0, r.output
    row = json.loads(out.read_text())["policies"]["fcfs"]
    assert 0 < row["refused"] < 300 and row["requests"] + row["refused"] == 300
    assert f"refused as overloaded: fcfs {row['refused']} " in r.output
    with open(records / "fcfs.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == row["requests"]


def test_jobs_csv_refuses_a_sweep_and_a_path_it_cannot_create(tmp_path):
    r = run("--limit", "20", "--sweep", "--jobs-csv", str(tmp_path / "j"))
    assert r.exit_code == 2 and "--jobs-csv records one run per policy" in r.stderr
    assert not (tmp_path / "j").exists()
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = run("--limit", "20", "--jobs-csv", str(blocker / "sub"))
    assert r.exit_code == 2 and "--jobs-csv: cannot create" in " ".join(r.stderr.split())
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "fcfs,lifo"], "unknown policy 'lifo'"),
        (["--profile", "gpt-9-tpu"], "unknown profile 'gpt-9-tpu'"),
        (["--profile", "/nonexistent/p.json"], "does not exist"),
        (["--kv-policy", "lru"], "kv_policy must be one of"),
        (["--lengths", "books"], "unknown length model 'books'"),
        (["--arrival", "gamma", "--cv", "-2"], "cv must be >= 0"),
        (["--time-scale", "2"], "--time-scale applies to --trace"),
        (["--sweep", "--sweep-metric", "max"], "sweep metric must be one of"),
        (["--prefill-chunk", "8"], "prefill_chunk must be 0 (off) or at least one KV block"),
        (["--prefill-chunk", "-1"], "prefill_chunk"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(args, message):
    r = run("--limit", "20", *args)
    assert r.exit_code == 2
    assert message in " ".join(r.stderr.split())
    assert "Traceback" not in r.stderr


def test_malformed_trace_names_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,12,4\n2.0,twelve,4\n")
    r = run("--trace", str(bad))
    assert r.exit_code == 2
    assert "bad.csv:3: field ContextTokens: 'twelve'" in " ".join(r.stderr.split())
    r = run("--trace", str(bad), "--rate", "3")
    assert r.exit_code == 2 and "--rate" in r.stderr


def test_real_process_exit_code(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fsd.cli", "simulate", "--trace", str(tmp_path / "none.csv")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr
