"""No daemon at a local endpoint: `fsctl` and `fsd status` say so at once, not after --timeout.

Each command is given --timeout 60 and must end well inside pytest's 20 s guard
with the message the 60 s wait would have ended with; a remote endpoint, a
listening socket or a held pidfile keeps the wait (`nothing_serves` is False).
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fsd.cli import app as fsd_app
from fsd.config import ServerConfig
from fsd.console.cli import app as fsctl_app
from fsd.local_daemon import nothing_serves
from fsd.pidfile import PidLock, state_files
from tests.client.fake_daemon import free_port

runner = CliRunner()


@pytest.fixture
def endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("command", [["status"], ["jobs"], ["submit", "hi"], ["top", "--once"]])
def test_fsctl_says_at_once_that_no_daemon_runs(command, endpoint, tmp_path):
    options = ["--endpoint", endpoint, "--state-dir", str(tmp_path), "--timeout", "60"]
    result = runner.invoke(fsctl_app, [*options, *command])
    assert result.exit_code == 2
    assert result.stderr == f"error: no fsd daemon answered at {endpoint}: none runs there (nothing listens and no daemon holds its pidfile); start one with `fsd start`\n"


@pytest.mark.timeout(20)
def test_fsd_status_says_at_once_that_no_daemon_runs(endpoint, tmp_path):
    args = ["status", "--endpoint", endpoint, "--state-dir", str(tmp_path), "--timeout", "60"]
    result = runner.invoke(fsd_app, args)
    assert result.exit_code == 2
    assert result.stderr == f"error: no fsd daemon answered at {endpoint}: none runs there (nothing listens and no daemon holds its pidfile); start one with `fsd start`\n"


def test_fsctl_submit_as_a_command(endpoint, tmp_path):
    cmd = [sys.executable, "-m", "fsd.console.cli", "--endpoint", endpoint,
           "--state-dir", str(tmp_path), "--timeout", "60",
           "submit", "--max-tokens", "8", "--stats", "The scheduler says"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    assert done.returncode == 2
    assert done.stderr.endswith(f"no fsd daemon answered at {endpoint}: none runs there (nothing listens and no daemon holds its pidfile); start one with `fsd start`\n")


def test_only_a_certain_absence_skips_the_wait(endpoint, tmp_path):
    state = str(tmp_path)
    assert nothing_serves(endpoint, state)
    assert nothing_serves(f"ipc://{tmp_path}/none.sock", state)
    assert not nothing_serves("tcp://10.1.2.3:5557", state)  # remote: wait for it
    assert not nothing_serves("tcp://fsd.example:5557", state)  # a host name: may be remote
    with socket.socket() as listener:  # a daemon of another state dir listens here
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not nothing_serves(f"tcp://127.0.0.1:{port}", state)
    # a daemon loading its model: its pidfile is locked, its socket not bound yet
    lock = PidLock(state_files(ServerConfig(endpoint=endpoint, state_dir=state))[0], endpoint)
    try:
        assert not nothing_serves(endpoint, state)
    finally:
        lock.release()
    assert nothing_serves(endpoint, state)
