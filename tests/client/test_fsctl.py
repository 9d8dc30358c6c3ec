"""`fsctl` commands through typer's CliRunner against the fake daemon."""

from __future__ import annotations

import json
import threading

import pytest
from typer.testing import CliRunner

from fsd import protocol as P
from fsd.client import Client, read_recording
from fsd.console.cli import app
from tests.client.fake_daemon import free_port

runner = CliRunner()


def fsctl(fake, *args: str, **kwargs):
    options = ["--endpoint", fake.endpoint, "--telemetry-endpoint", fake.telemetry_endpoint]
    return runner.invoke(app, [*options, "--timeout", "3", *args], **kwargs)


def test_version():
    from fsd import __version__

    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and result.stdout.strip() == __version__


def test_status(fake):
    result = fsctl(fake, "status")
    assert result.exit_code == 0, result.output
    assert "policy      skip-join  (kv: proactive)" in result.stdout
    assert "pid 1234" in result.stdout
    as_json = json.loads(fsctl(fake, "status", "--json").stdout)
    assert as_json["model"] == "tiny" and as_json["type"] == "status_reply"


def test_endpoint_from_the_environment(fake):
    result = runner.invoke(app, ["status"], env={"FSD_ENDPOINT": fake.endpoint})
    assert result.exit_code == 0, result.output


def test_submit_streams_text_and_stats(fake):
    result = fsctl(fake, "submit", "abc", "--max-tokens", "5", "--tag", "t1", "--stats")
    assert result.exit_code == 0, result.output
    assert result.stdout == "abcab\n"
    assert "5 tokens, finish=length" in result.stderr
    submit = fake.requests(P.Submit)[0]
    assert submit.sampling.max_tokens == 5 and submit.tags == ["t1"]


def test_submit_refused_is_one_line_and_exit_2(fake):
    result = fsctl(fake, "submit", "z" * 200)
    assert result.exit_code == 2
    assert result.stderr == "error: prompt of 200 tokens exceeds 100 (prompt-too-long)\n"
    bad = fsctl(fake, "submit", "x", "--top-p", "0")
    assert bad.exit_code == 2 and "top_p must be in (0, 1]" in bad.stderr
    for value in ("nan", "inf", "-1"):  # NaN used to reach the daemon and kill it
        bad = fsctl(fake, "submit", "x", "--temperature", value)
        assert bad.exit_code == 2 and bad.stderr.startswith("error: temperature"), bad.stderr
    assert fake.requests(P.Submit) == [fake.requests(P.Submit)[0]]  # the bad one never left


def test_jobs_job_and_abort(fake):
    assert fsctl(fake, "jobs").stdout == "no jobs\n"
    fake.hold = True
    with Client(fake.endpoint) as c:  # injected jobs are this connection's while it is open
        ids = c.inject(burst=(2, 4, 4), tag="burst")
        table = fsctl(fake, "jobs")
        assert table.exit_code == 0, table.output
        assert all(job_id in table.stdout for job_id in ids) and "burst" in table.stdout
        assert [j["job_id"] for j in json.loads(fsctl(fake, "jobs", "--json").stdout)] == ids
        detail = fsctl(fake, "job", ids[0])
        assert detail.exit_code == 0 and f"job         {ids[0]}" in detail.stdout
        assert fsctl(fake, "abort", ids[0]).stdout == f"aborted {ids[0]}\n"
        missing = fsctl(fake, "job", ids[0])
        assert missing.exit_code == 2
        assert missing.stderr == f"error: no job {ids[0]} (unknown-job)\n"
    assert fsctl(fake, "jobs").stdout == "no jobs\n"  # closing the client aborted the other


def test_retune_parses_values(fake):
    result = fsctl(fake, "retune", "policy=fcfs", "quanta=0.01,0.02,0.04")
    assert result.exit_code == 0, result.output
    assert result.stdout == "policy = fcfs\nquanta = 0.01,0.02,0.04\n"
    assert fake.requests(P.Retune)[0].changes == {"policy": "fcfs", "quanta": [0.01, 0.02, 0.04]}
    units = fsctl(
        fake,
        "retune",
        "q1=5ms",
        "starve_limit=1.5s",
        "quanta=2ms",
        "starve_limit_waiting=150ms",
        "preempt_threshold=2",
    )
    assert units.exit_code == 0, units.output
    assert fake.requests(P.Retune)[1].changes == {
        "q1": 0.005,
        "starve_limit": 1.5,
        "quanta": [0.002],
        "starve_limit_waiting": 0.15,
        "preempt_threshold": 2,
    }
    assert fsctl(fake, "retune", "q1=none").stdout == "q1 = none (the default)\n"
    assert fake.requests(P.Retune)[2].changes == {"q1": None}
    bad_unit = fsctl(fake, "retune", "q1=5 parsecs")
    assert bad_unit.exit_code == 2
    assert bad_unit.stderr == "error: q1: '5 parsecs' is not a duration (e.g. 0.01, 10ms, 250us)\n"
    refused = fsctl(fake, "retune", "bogus=1")
    assert refused.exit_code == 2 and "(invalid-setting)" in refused.stderr
    malformed = fsctl(fake, "retune", "policy")
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


def test_inject_burst_and_scenario(fake, tmp_path):
    fake.hold = True
    burst = fsctl(fake, "inject", "--count", "2", "--input-len", "4", "--output-len", "3",
                  "--tag", "b", "--no-wait")  # fmt: skip
    assert burst.exit_code == 0, burst.output
    assert burst.stdout == "injected 2 jobs (tag b): job-1 job-2\n"
    many = fsctl(fake, "inject", "--count", "20", "--input-len", "4", "--output-len", "3",
                 "--no-wait")  # fmt: skip
    assert many.stdout == "injected 20 jobs (tag injected): job-3 .. job-22\n"
    (tmp_path / "traces").mkdir()
    csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n0,4,2\n0.5,8,3\n"
    (tmp_path / "traces" / "mini.csv").write_text(csv)
    scenario = tmp_path / "burst.toml"
    scenario.write_text(SCENARIO)
    played = fsctl(fake, "inject", "--scenario", str(scenario), "--no-wait")
    assert played.exit_code == 0, played.output
    sent = fake.requests(P.Inject)[2]
    # the file and its trace travel inline: the daemon opens no path a client names
    assert sent.scenario == SCENARIO and sent.traces == {"traces/mini.csv": csv}
    assert fsctl(fake, "inject", "--count", "2").exit_code == 2
    missing = fsctl(fake, "inject", "--scenario", str(tmp_path / "nope.toml"))
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    scenario.write_text(SCENARIO.replace("mini.csv", "gone.csv"))
    no_trace = fsctl(fake, "inject", "--scenario", str(scenario))
    assert (
        no_trace.exit_code == 2 and "trace file 'traces/gone.csv' does not exist" in no_trace.stderr
    )
    assert len(fake.requests(P.Inject)) == 3  # the refused ones never left


def test_inject_waits_for_its_jobs_by_default(fake):
    result = fsctl(fake, "inject", "--count", "3", "--input-len", "4", "--output-len", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout == "injected 3 jobs (tag injected): job-1 job-2 job-3\nended: 3 length\n"


def test_drain_and_shutdown(fake):
    assert fsctl(fake, "drain", "--drain-timeout", "1").stdout == "drain: jobs=0\n"
    assert fsctl(fake, "shutdown").stdout == "shutdown: ok\n"
    assert fake.requests(P.Drain)[0].timeout == 1.0


def test_watch_snapshots_and_events(fake):
    result = fsctl(fake, "watch", "--snapshots", "--count", "3")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(" snapshot #" in line for line in lines)
    assert "policy=skip-join" in lines[0] and "kv=8/64" in lines[0]

    stop = threading.Event()

    def keep_finishing_jobs() -> None:
        with Client(fake.endpoint) as c:
            while not stop.is_set():
                c.complete("ab", max_tokens=2)

    worker = threading.Thread(target=keep_finishing_jobs)
    worker.start()
    try:
        events = fsctl(fake, "watch", "--events", "--count", "2")
    finally:
        stop.set()
        worker.join(5)
    assert events.exit_code == 0, events.output
    assert all(" event finish job-" in line for line in events.stdout.splitlines())


def test_record_then_read_back(fake, tmp_path):
    path = tmp_path / "run.fsdrec"
    result = fsctl(fake, "record", str(path), "--duration", "0.3")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("recorded ") and str(path) in result.stderr
    messages = list(read_recording(path))
    assert messages and all(isinstance(m, P.Snapshot) for m in messages)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["status"], "error: no fsd daemon answered at tcp://127.0.0.1:{port} within 0.3 s\n"),
        (
            ["submit", "hi"],
            "error: no fsd daemon answered at tcp://127.0.0.1:{port} within 0.3 s\n",
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


def test_curve_needs_both_keys(fake):
    result = fsctl(fake, "--server-key", "server.key", "status")
    assert result.exit_code == 2
    assert result.stderr == "error: CURVE needs both --server-key and --client-key\n"
