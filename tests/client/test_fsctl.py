"""`fsctl` commands through typer's CliRunner against a real daemon of this module's own
(the last test that uses it, `test_drain_and_shutdown`, shuts it down)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from typer.testing import CliRunner

from fsd import protocol as P
from fsd.client import read_recording
from fsd.console.cli import app
from tests.client.conftest import CONFIG
from tests.client.fake_daemon import free_port
from tests.server.daemon_proc import daemon_fixture

runner = CliRunner()
daemon = daemon_fixture(CONFIG, "fsctl")  # this module's own: its last test shuts it down


def fsctl(daemon, *args: str, **kwargs):
    """fsctl on `daemon`, with its operator token (its --state-dir holds the token file)."""
    options = ["--endpoint", daemon.endpoint, "--telemetry-endpoint", daemon.telemetry,
               "--state-dir", str(daemon.state_dir), "--timeout", "10"]  # fmt: skip
    return runner.invoke(app, [*options, *args], **kwargs)


def test_version():
    from fsd import __version__

    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and result.stdout.strip() == __version__


def test_status(daemon):
    result = fsctl(daemon, "status")
    assert result.exit_code == 0, result.output
    assert "policy      fsd  (kv: proactive)" in result.stdout
    assert f"pid {daemon.proc.pid}" in result.stdout
    as_json = json.loads(fsctl(daemon, "status", "--json").stdout)
    assert as_json["model"] == "preset:tiny" and as_json["type"] == "status_reply"
    assert as_json["role"] == "operator"


def test_endpoint_from_the_environment(daemon):
    result = runner.invoke(app, ["status"], env={"FSD_ENDPOINT": daemon.endpoint})
    assert result.exit_code == 0, result.output
    assert f"pid {daemon.proc.pid}" in result.stdout


def test_submit_streams_text_and_stats(daemon):
    result = fsctl(daemon, "submit", "abc", "--max-tokens", "5", "--ignore-eos", "--tag", "t1",
                   "--stats")  # fmt: skip
    assert result.exit_code == 0, result.output
    with daemon.client() as c:  # greedy: the same prompt gives the same text
        assert result.stdout == c.complete("abc", max_tokens=5, ignore_eos=True).text + "\n"
    assert "5 tokens, finish=length" in result.stderr


def test_submit_refused_is_one_line_and_exit_2(daemon):
    result = fsctl(daemon, "submit", "z" * 5000)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: prompt has 5000 tokens")
    assert result.stderr.endswith(" (prompt-too-long)\n") and len(result.stderr.splitlines()) == 1
    bad = fsctl(daemon, "submit", "x", "--top-p", "0")
    assert bad.exit_code == 2 and "top_p must be in (0, 1]" in bad.stderr
    for value in ("nan", "inf", "-1"):  # NaN used to reach the daemon and kill it
        bad = fsctl(daemon, "submit", "x", "--temperature", value)
        assert bad.exit_code == 2 and bad.stderr.startswith("error: temperature"), bad.stderr
    assert fsctl(daemon, "status").exit_code == 0


def test_jobs_job_and_abort(daemon):
    assert fsctl(daemon, "jobs").stdout == "no jobs\n"
    with daemon.client() as c:  # injected jobs are this connection's while it is open
        ids = c.inject(burst=(2, 4, 2000), tag="burst")
        table = fsctl(daemon, "jobs")
        assert table.exit_code == 0, table.output
        assert all(job_id in table.stdout for job_id in ids) and "burst" in table.stdout
        listed = json.loads(fsctl(daemon, "jobs", "--json").stdout)
        assert sorted(j["job_id"] for j in listed) == sorted(ids)
        detail = fsctl(daemon, "job", ids[0])
        assert detail.exit_code == 0 and f"job         {ids[0]}" in detail.stdout
        assert fsctl(daemon, "abort", ids[0]).stdout == f"aborted {ids[0]}\n"
        assert c.wait_injected(ids[:1], timeout=10)[ids[0]].reason == "abort"
        missing = fsctl(daemon, "job", ids[0])
        assert missing.exit_code == 2
        assert missing.stderr == f"error: no job with id {ids[0]!r} (unknown-job)\n"
    # closing the client aborted the other (the daemon would reap it only after 30 s)
    deadline = time.monotonic() + 10
    while fsctl(daemon, "jobs").stdout != "no jobs\n":
        assert time.monotonic() < deadline, "the injected job outlived its client"
        time.sleep(0.05)


def test_retune_parses_values(daemon):
    result = fsctl(daemon, "retune", "policy=fcfs", "quanta=0.01,0.02,0.04")
    assert result.exit_code == 0, result.output
    assert result.stdout == "policy = fcfs\nquanta = 0.01,0.02,0.04\n"
    units = fsctl(daemon, "retune", "policy=sj-mlfq", "quanta=none", "q1=5ms", "fsd.alpha=50",
                  "sj-mlfq.waiting_alpha=1.5", "sj-mlfq.threshold=2", "fsd.swap_gate=off")  # fmt: skip
    assert units.exit_code == 0, units.output
    assert units.stdout.splitlines() == [
        "policy = sj-mlfq",
        "quanta = none (the default)",
        "q1 = 0.005",
        "fsd.alpha = 50",  # a policy's own: alphas in SLOs, each retunable alone
        "sj-mlfq.waiting_alpha = 1.5",
        "sj-mlfq.threshold = 2",
        "fsd.swap_gate = False",
    ]
    reset = fsctl(daemon, "retune", "policy=default", "q1=none", "policy_settings=none")
    assert reset.exit_code == 0, reset.output
    assert "q1 = none (the default)" in reset.stdout
    assert "policy_settings = none (the default)" in reset.stdout  # each policy's own rules
    seconds = fsctl(daemon, "retune", "fsd.alpha=1.5s")  # SLOs, not a duration
    assert seconds.exit_code == 2 and "fsd.alpha must be float, got '1.5s'" in seconds.stderr
    gone = fsctl(daemon, "retune", "starve_limit=1.5")  # the alpha in seconds is no more
    assert gone.exit_code == 2 and "unknown setting starve_limit" in gone.stderr
    bad_unit = fsctl(daemon, "retune", "q1=5 parsecs")
    assert bad_unit.exit_code == 2
    assert bad_unit.stderr == "error: q1: '5 parsecs' is not a duration (e.g. 0.01, 10ms, 250us)\n"
    refused = fsctl(daemon, "retune", "nosuchkey=1")  # unknown: said so, valid keys listed
    assert refused.exit_code == 2 and refused.stderr.endswith("(invalid-setting)\n")
    assert refused.stderr.startswith("error: unknown setting nosuchkey; retunable: ")
    assert "max_batch_size" in refused.stderr and "while running" not in refused.stderr
    fixed = fsctl(daemon, "retune", "block_size=8")  # known, but fixed at start
    assert fixed.stderr.startswith("error: cannot retune block_size while running")
    malformed = fsctl(daemon, "retune", "policy")
    assert malformed.exit_code == 2
    assert malformed.stderr == "error: expected KEY=VALUE, got 'policy'\n"


SCENARIO = """
[scenario]
name = "burst"
duration = 2.0
[[phase]]
arrival = "trace"
trace = "traces/mini.csv"
"""


def test_inject_burst_and_scenario(daemon, tmp_path):
    burst = fsctl(daemon, "inject", "--count", "2", "--input-len", "4", "--output-len", "3",
                  "--tag", "b", "--no-wait")  # fmt: skip
    assert burst.exit_code == 0, burst.output
    assert burst.stdout.startswith("injected 2 jobs (tag b): job-")
    many = fsctl(daemon, "inject", "--count", "12", "--input-len", "4", "--output-len", "3",
                 "--no-wait")  # fmt: skip
    assert many.exit_code == 0, many.output
    assert many.stdout.startswith("injected 12 jobs (tag injected): job-") and " .. " in many.stdout
    (tmp_path / "traces").mkdir()
    csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n0,4,2\n0.5,8,3\n"
    (tmp_path / "traces" / "mini.csv").write_text(csv)
    scenario = tmp_path / "burst.toml"
    scenario.write_text(SCENARIO)
    # the file and its trace travel inline: the daemon opens no path a client names
    played = fsctl(daemon, "inject", "--scenario", str(scenario))
    assert played.exit_code == 0, played.output
    assert played.stdout.startswith("injected 2 jobs (tag injected): ")
    assert played.stdout.endswith("ended: 2 length\n")
    assert fsctl(daemon, "inject", "--count", "2").exit_code == 2
    missing = fsctl(daemon, "inject", "--scenario", str(tmp_path / "nope.toml"))
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    scenario.write_text(SCENARIO.replace("mini.csv", "gone.csv"))
    no_trace = fsctl(daemon, "inject", "--scenario", str(scenario))
    assert (
        no_trace.exit_code == 2 and "trace file 'traces/gone.csv' does not exist" in no_trace.stderr
    )


def test_inject_waits_for_its_jobs_by_default(daemon):
    result = fsctl(daemon, "inject", "--count", "3", "--input-len", "4", "--output-len", "3")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("injected 3 jobs (tag injected): job-")
    assert lines[1:] == ["ended: 3 length"]
    progress = result.stderr.splitlines()  # not a terminal: plain lines, first and last
    assert progress[0] == "waiting for 3 jobs (Ctrl-C aborts them): 0/3"
    assert progress[-1].startswith("waiting for 3 jobs (Ctrl-C aborts them): done 3/3 in ")


def test_watch_snapshots_and_events(daemon):
    result = fsctl(daemon, "watch", "--snapshots", "--count", "3")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(" snapshot #" in line for line in lines)
    assert "policy=fsd" in lines[0] and "/512 " in lines[0]

    stop = threading.Event()

    def keep_running_jobs() -> None:
        with daemon.client() as c:
            while not stop.is_set():
                c.complete([1, 2], max_tokens=2, ignore_eos=True)

    worker = threading.Thread(target=keep_running_jobs)
    worker.start()
    try:
        events = fsctl(daemon, "watch", "--events", "--count", "2")
    finally:
        stop.set()
        worker.join(10)
    assert events.exit_code == 0, events.output
    assert all(" event " in line and " job-" in line for line in events.stdout.splitlines())


def test_record_then_read_back(daemon, tmp_path):
    path = tmp_path / "run.fsdrec"
    result = fsctl(daemon, "record", str(path), "--duration", "0.3")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("recorded ") and str(path) in result.stderr
    messages = list(read_recording(path))
    assert any(isinstance(m, P.Snapshot) for m in messages)
    assert all(isinstance(m, P.Snapshot | P.Event) for m in messages)


def test_record_on_a_full_disk_is_one_error_line(daemon):
    # /dev/full answers every write with ENOSPC, as a full disk does
    result = fsctl(daemon, "record", "/dev/full", "--duration", "5")
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: cannot write the recording '/dev/full': No space left on device\n"
    ), result.stderr
    assert "Traceback" not in result.output


def test_drain_and_shutdown(daemon):
    # the last test of this module: the daemon exits
    drained = fsctl(daemon, "drain", "--drain-timeout", "10")
    assert drained.stdout == "drain: drained=True remaining=0\n", drained.output
    refused = fsctl(daemon, "submit", "x")
    assert refused.exit_code == 2 and refused.stderr.endswith("(draining)\n")
    assert fsctl(daemon, "undrain").stdout == "undrain: draining=False\n"
    assert fsctl(daemon, "shutdown").stdout.startswith("shutdown: ")
    assert daemon.proc.wait(30) == 0


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["status"], "error: no fsd daemon answered at tcp://127.0.0.1:{port}: none runs there (nothing listens and no daemon holds its pidfile); start one with `fsd start`\n"),
        (
            ["submit", "hi"],
            "error: no fsd daemon answered at tcp://127.0.0.1:{port}: none runs there (nothing listens and no daemon holds its pidfile); start one with `fsd start`\n",
        ),
        (["watch"], "error: no telemetry from tcp://127.0.0.1:{port} within 0.3 s"),
        (["record", "x.fsdrec"], "error: no telemetry from tcp://127.0.0.1:{port} within 0.3 s"),
    ],
)
def test_unreachable_daemon_is_one_line_and_exit_2(command, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    options = ["--endpoint", endpoint, "--telemetry-endpoint", endpoint, "--timeout", "0.3"]
    result = runner.invoke(app, [*options, *command])
    assert result.exit_code == 2
    assert result.stderr.startswith(message.format(port=port))
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.output
    assert not (tmp_path / "x.fsdrec").exists()


def test_curve_needs_both_keys():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["--endpoint", endpoint, "--server-key", "server.key", "status"])
    assert result.exit_code == 2
    assert result.stderr == "error: CURVE needs both --server-key and --client-key\n"
