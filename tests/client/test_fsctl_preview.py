"""`fsctl retune --preview` against the fake daemon: what it sends, prints and refuses."""

from __future__ import annotations

import threading
import time

import pytest
from typer.testing import CliRunner

from fsd import protocol as P
from fsd.client import Client
from fsd.console.cli import app
from tests.client.fake_daemon import FakeDaemon, running

runner = CliRunner()


@pytest.fixture
def fake():
    with running() as daemon:
        yield daemon


def fsctl(daemon: FakeDaemon, tmp_path, *args: str, token: str | None = None):
    """fsctl on the fake; its own empty state folder, so no real token file is read."""
    options = ["--endpoint", daemon.endpoint, "--state-dir", str(tmp_path), "--timeout", "5"]
    env = {"FSD_TOKEN": token} if token else {"FSD_TOKEN": None, "FSD_TOKEN_FILE": None}
    return runner.invoke(app, [*options, *args], env=env)


def test_preview_prints_both_sides_and_applies_nothing(fake, tmp_path):
    result = fsctl(fake, tmp_path, "retune", "--preview", "policy=fcfs", "q1=5ms",
                   "quanta=10ms,20ms", "--horizon", "30", "--seeds", "2")  # fmt: skip
    assert result.exit_code == 0, result.output
    (sent,) = fake.requests(P.Preview)
    assert sent.changes == {"policy": "fcfs", "q1": 0.005, "quanta": [0.01, 0.02]}
    assert (sent.horizon, sent.seeds) == (30.0, 2)
    assert not fake.requests(P.Retune)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("preview of policy=fcfs q1=0.005 quanta=0.01,0.02 (nothing applied")
    assert lines[1].split() == ["current", "proposed", "change"]
    assert lines[3].split() == ["P95", "per-token", "(ms)", "50.0", "[45.0–55.0]", "40.0",
                                "[36.0–44.0]", "-20%"]  # fmt: skip
    assert "  horizon 30 s, 2 seeds (0, 1)" in lines
    assert "  note: the fake daemon's canned preview" in lines
    assert "previewing... (runs the twin for 30 s of simulated time)" in result.stderr


def test_preview_defaults_and_retune_without_it_is_unchanged(fake, tmp_path):
    assert fsctl(fake, tmp_path, "retune", "--preview", "policy=fcfs").exit_code == 0
    (sent,) = fake.requests(P.Preview)
    assert (sent.horizon, sent.seeds) == (60.0, 4)
    plain = fsctl(fake, tmp_path, "retune", "policy=fcfs")  # the fake serves no Retune
    assert plain.exit_code == 2 and plain.stderr.endswith("(unsupported)\n")
    assert [r.changes for r in fake.requests(P.Retune)] == [{"policy": "fcfs"}]
    assert len(fake.requests(P.Preview)) == 1


def test_preview_refusals_are_one_line_and_exit_2(fake, tmp_path):
    unknown = fsctl(fake, tmp_path, "retune", "--preview", "bogus=1")
    assert unknown.exit_code == 2 and unknown.stdout == ""
    previewing, refusal = unknown.stderr.splitlines()  # the refusal is one line
    assert previewing.startswith("previewing...") and refusal.startswith(
        "error: unknown setting bogus"
    )
    assert refusal.endswith("(invalid-setting)")
    seeds = fsctl(fake, tmp_path, "retune", "--preview", "policy=fcfs", "--seeds", "99")
    assert seeds.exit_code == 2 and seeds.stderr.endswith("(invalid-setting)\n")
    bad_unit = fsctl(fake, tmp_path, "retune", "--preview", "q1=5 parsecs")
    assert bad_unit.exit_code == 2 and "is not a duration" in bad_unit.stderr
    assert len(fake.requests(P.Preview)) == 2  # the bad unit never left


def test_a_second_preview_is_overloaded(fake, tmp_path):
    fake.hold_previews = True
    with Client(fake.endpoint, timeout=5) as c:
        first = threading.Thread(target=c.preview, kwargs={"policy": "fcfs"}, daemon=True)
        first.start()
        deadline = time.monotonic() + 10
        while not fake.previews and time.monotonic() < deadline:
            time.sleep(0.01)
        busy = fsctl(fake, tmp_path, "retune", "--preview", "policy=srpt")
        fake.hold_previews = False
        first.join(10)
    assert busy.exit_code == 2 and busy.stderr.endswith("(overloaded)\n"), busy.output


def test_preview_needs_the_operator_token(tmp_path):
    with running(token="s3cret") as fake:
        refused = fsctl(fake, tmp_path, "retune", "--preview", "policy=fcfs")
        assert refused.exit_code == 2 and refused.stderr.endswith("(forbidden)\n")
        allowed = fsctl(fake, tmp_path, "retune", "--preview", "policy=fcfs", token="s3cret")
        assert allowed.exit_code == 0, allowed.output
