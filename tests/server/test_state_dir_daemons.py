"""Which process `fsd stop` may signal, and which token a client may offer (P21).

`fsd stop` signals a pid only when it holds the pidfile's lock *and* its command line
is an fsd `start --foreground` of this very state folder. A token file left by a
daemon killed with SIGKILL is never offered (no live daemon holds the lock beside
it) and never accepted (the next daemon draws its own).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fsd.client import Client, RequestError
from fsd.config import ServerConfig
from fsd.credentials import find_operator_token, token_path, write_secret
from fsd.daemon_control import _signal
from fsd.pidfile import DaemonError, fsd_args, option_value, probe_pidfile
from fsd.server.roles import Authorizer
from tests.server.daemon_proc import start_daemon
from tests.server.test_daemon_life import fsd

needs_proc = pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux /proc")

# a process that calls itself `fsd` and holds the pidfile's lock, as a daemon would
FAKE_FSD = (
    "import fcntl, os, time\n"
    "fd = os.open(os.environ['LOCK'], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('locked', flush=True)\n"
    "time.sleep(120)\n"
)


def private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


def holder(
    tmp: Path, pidfile: Path, args: list[str], children: list, cwd: Path | None = None
) -> subprocess.Popen:
    """`python TMP/fsd ARGS` holding `pidfile`'s lock (returns once it does)."""
    script = tmp / "fake" / "fsd"
    script.parent.mkdir(exist_ok=True)
    script.write_text(FAKE_FSD)
    env = {**os.environ, "LOCK": str(pidfile)}
    proc = subprocess.Popen(
        [sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    children.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def pidfile_says(pidfile: Path, pid: int, **more: object) -> None:
    pidfile.write_text(json.dumps({"pid": pid, "state": "serving", **more}))


def test_the_fsd_program_and_its_state_dir_are_read_from_a_command_line():
    py = "/venv/bin/python"
    assert fsd_args([py, "-m", "fsd.cli", "start", "--foreground"]) == ["start", "--foreground"]
    assert fsd_args([py, "-X", "dev", "-m", "fsd.cli", "stop"]) == ["stop"]
    assert fsd_args([py, "/venv/bin/fsd", "start"]) == ["start"]
    assert fsd_args(["/usr/local/bin/fsd", "start"]) == ["start"]
    assert fsd_args([py, "-c", "code", "-m", "fsd.cli", "start"]) is None  # `-c` code
    assert fsd_args([py, "-m", "other", "fsd"]) is None
    assert fsd_args(["sleep", "fsd"]) is None
    args = ["start", "--state-dir", "a", "--state-dir=b", "--state-dir"]
    assert option_value(args, "--state-dir") == "b"  # the last one, as click reads them
    assert option_value(["start"], "--state-dir") is None


@needs_proc
def test_a_lock_holder_that_is_no_fsd_daemon_of_this_state_dir_gets_no_signal(tmp_path, children):
    folder = private(tmp_path / "state")
    other = private(tmp_path / "other")
    pidfile = folder / "fsd-x.pid"
    refusals = {
        "not an fsd daemon": (["serve"], {}),  # fsd, but not `start`
        "not an fsd daemon ": (["start", "--state-dir", str(folder)], {}),  # not --foreground
        f"state_dir '{other}'": (["start", "--foreground", "--state-dir", str(other)], {}),
        f"state_dir '{other}' ": (["start", "--foreground"], {"state_dir": str(other)}),
        "nor": (["start", "--foreground"], {}),  # nothing says which folder
    }
    for says, (args, more) in refusals.items():
        proc = holder(tmp_path, pidfile, args, children)
        pidfile_says(pidfile, proc.pid, **more)
        with pytest.raises(DaemonError, match="signalled nothing") as err:
            _signal(pidfile, signal.SIGTERM)
        assert says.strip() in str(err.value), (args, str(err.value))
        assert proc.poll() is None  # not signalled
        proc.kill()
        proc.wait()
    # an fsd daemon of this folder, named relative to its own working folder: signalled
    proc = holder(tmp_path, pidfile, ["start", "--foreground", "--state-dir", "state"], children,
                  cwd=tmp_path)  # fmt: skip
    pidfile_says(pidfile, proc.pid, state_dir=str(folder))
    _signal(pidfile, signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM


@needs_proc
def test_a_real_daemon_records_its_state_dir_and_is_signalled(tmp_path):
    d = start_daemon(tmp_path)
    try:
        pidfile = next(d.state_dir.glob("*.pid"))
        held, info = probe_pidfile(pidfile)
        assert held and info["pid"] == d.proc.pid
        assert info["state_dir"] == str(d.state_dir.resolve())
        _signal(pidfile, signal.SIGTERM)  # drains and exits
        assert d.proc.wait(120) == 0
    finally:
        d.stop()


# ---- the operator token of a killed daemon ---------------------------------------


@needs_proc
def test_a_token_file_is_offered_only_while_a_daemon_holds_the_lock(tmp_path, children):
    folder = private(tmp_path / "state")
    ep = "tcp://127.0.0.1:5999"
    tok = token_path(folder, ep)
    tok.write_text("OLD-TOKEN\n")
    tok.chmod(0o600)
    assert find_operator_token(ep, folder) is None  # no pidfile: no daemon
    proc = holder(tmp_path, tok.with_suffix(".pid"), ["start", "--foreground"], children)
    assert find_operator_token(ep, folder) == "OLD-TOKEN"
    proc.kill()
    proc.wait()
    assert find_operator_token(ep, folder) is None  # the lock died with it


def test_a_sigkilled_daemons_token_is_neither_offered_nor_accepted(tmp_path):
    first = start_daemon(tmp_path)
    old = first.token
    tok = token_path(first.state_dir, first.endpoint)
    assert old and tok.read_text().strip() == old
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    assert tok.read_text().strip() == old  # it outlives the daemon (nothing removed it)
    assert find_operator_token(first.endpoint, first.state_dir) is None  # never offered

    # a start that fails past the lock (its port is taken) still removes the old file:
    # a daemon clears it before it loads, not once it serves
    port = int(first.endpoint.rsplit(":", 1)[1])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        failed = fsd("start", "--foreground", "--endpoint", first.endpoint,
                     "--telemetry-endpoint", first.telemetry, "--state-dir", str(first.state_dir))  # fmt: skip
    assert failed.returncode == 2 and "cannot bind" in failed.stderr, failed.stderr
    assert not tok.exists()

    # the next daemon on the same endpoint and state folder: the old token never works
    second = start_daemon(tmp_path, endpoints=(first.endpoint, first.telemetry))
    try:
        assert second.token not in (None, old)
        with Client(second.endpoint, timeout=10, token=old) as c:
            assert c.status().role == "client"
            with pytest.raises(RequestError) as info:
                c.retune(policy="fcfs")
            assert info.value.code == "forbidden"
        with second.client() as op:
            assert op.status().role == "operator"
    finally:
        assert second.stop() == 0


def test_the_token_file_is_removed_at_exit_only_if_it_is_still_the_daemons(tmp_path):
    folder = private(tmp_path / "state")
    auth = Authorizer(ServerConfig(state_dir=str(folder)))
    tok = auth.token_file
    assert tok.read_text().strip() == auth.token
    # a link there now, to a file holding the very token: never read through, left alone
    target = tmp_path / "elsewhere"
    target.write_text(auth.token + "\n")
    tok.unlink()
    tok.symlink_to(target)
    auth.close()
    assert tok.is_symlink() and target.read_text().strip() == auth.token
    tok.unlink()
    write_secret(tok, "ANOTHER-DAEMONS-TOKEN\n")  # replaced by another daemon: kept
    auth.close()
    assert tok.read_text() == "ANOTHER-DAEMONS-TOKEN\n"
    write_secret(tok, auth.token + "\n")  # its own: removed
    auth.close()
    assert not tok.exists()
