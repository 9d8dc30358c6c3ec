"""Process life: SIGTERM drains, fsd start/stop/status, loopback-only without CURVE."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from fsd.client import Client, CurveKeys, DaemonUnavailable
from fsd.credentials import state_stem
from fsd.server.security import generate_keys
from tests.server.daemon_proc import free_port, start_daemon


def fsd(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsd.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_sigterm_lets_in_flight_jobs_finish_then_exits(tmp_path):
    d = start_daemon(tmp_path)
    with d.client(timeout=30) as c:
        handle = c.submit([3, 4, 5], max_tokens=60, ignore_eos=True)
        handle.accepted(timeout=10)
        d.proc.send_signal(signal.SIGTERM)
        done = handle.result(timeout=60)
    assert done.finish_reason == "length" and len(done.token_ids) == 60
    assert d.proc.wait(60) == 0
    assert not list(d.state_dir.glob("*.pid"))


def test_start_status_stop_in_the_background(tmp_path):
    ep, tep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    state = str(tmp_path / "state")
    started = fsd("start", "--endpoint", ep, "--telemetry-endpoint", tep, "--state-dir", state)
    assert started.returncode == 0, started.stderr
    assert "fsd started: pid" in started.stdout
    st = fsd("status", "--endpoint", ep)
    assert st.returncode == 0 and "model preset:tiny" in st.stdout and "policy fsd" in st.stdout
    again = fsd("start", "--endpoint", ep, "--telemetry-endpoint", tep, "--state-dir", state)
    assert again.returncode == 2 and "already serves" in again.stderr
    stopped = fsd("stop", "--endpoint", ep, "--state-dir", state)
    assert stopped.returncode == 0, stopped.stderr
    gone = fsd("status", "--endpoint", ep, "--timeout", "1")
    assert gone.returncode == 2 and "no fsd daemon answered" in gone.stderr


def test_binding_beyond_loopback_without_keys_is_refused(tmp_path):
    proc = fsd(
        "start",
        "--foreground",
        "--endpoint",
        f"tcp://0.0.0.0:{free_port()}",
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert proc.returncode == 2
    assert "refusing to bind" in proc.stderr and "fsd keys generate" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_with_curve_keys_only_clients_holding_keys_are_served(tmp_path):
    keys = generate_keys(tmp_path / "keys")
    config = (
        f'[server]\ncurve_secret_key = "{keys["server_secret"]}"\n'
        f'curve_authorized_dir = "{keys["authorized"]}"\n'
    )
    creds = CurveKeys(
        server_public=str(keys["server_public"]),
        client_public=str(keys["client-1_secret"]),
        client_secret=str(keys["client-1_secret"]),
    )
    d = start_daemon(tmp_path, config, curve=creds)
    try:
        with d.client() as c:
            assert c.status().model == "preset:tiny"
            assert len(c.complete([1, 2], max_tokens=2, ignore_eos=True).token_ids) == 2
        with Client(d.endpoint, timeout=2.0) as plain, pytest.raises(DaemonUnavailable):
            plain.status()
    finally:
        assert d.stop() == 0


# ---- the pidfile lock, readiness and clear start errors (P8 findings 6-8) ----------


def endpoints() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pid: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def started_pid(proc: subprocess.CompletedProcess[str]) -> int:
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"fsd started: pid (\d+)", proc.stdout)
    assert match, proc.stdout
    return int(match.group(1))


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_a_stale_pidfile_naming_another_process_is_never_signalled(tmp_path):
    ep, tep = endpoints()
    state = tmp_path / "state"
    state.mkdir()
    bystander = subprocess.Popen(["sleep", "60"])  # the pid a killed daemon's file names
    pidfile = state / f"{state_stem(ep)}.pid"
    pidfile.write_text(json.dumps({"pid": bystander.pid, "endpoint": ep}))
    try:
        stopped = fsd("stop", "--endpoint", ep, "--state-dir", str(state))
        assert stopped.returncode == 2 and f"no fsd daemon runs for {ep}" in stopped.stderr
        assert bystander.poll() is None  # not SIGTERMed
        assert not pidfile.exists()  # the stale file is gone

        pidfile.write_text(json.dumps({"pid": bystander.pid, "endpoint": ep}))
        started = fsd(
            "start", "--endpoint", ep, "--telemetry-endpoint", tep, "--state-dir", str(state)
        )
        pid = started_pid(started)  # not "already serves"
        try:
            assert json.loads(pidfile.read_text())["pid"] == pid
            stopped = fsd("stop", "--endpoint", ep, "--state-dir", str(state))
            assert stopped.returncode == 0 and f"(pid {pid})" in stopped.stdout, stopped.stderr
            assert wait_gone(pid) and not pidfile.exists()
        finally:
            kill_quietly(pid)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_second_start_on_a_busy_endpoint_reports_the_bind_error(tmp_path):
    ep, tep = endpoints()
    first = fsd(
        "start", "--endpoint", ep, "--telemetry-endpoint", tep, "--state-dir", str(tmp_path / "a")
    )
    pid = started_pid(first)
    try:
        other = tmp_path / "b"
        other.mkdir()
        old_log = other / f"{state_stem(ep)}.log"
        old_log.write_text("OLD LINE from an earlier start\n" * 50)
        second = fsd(
            "start", "--endpoint", ep, "--telemetry-endpoint", tep, "--state-dir", str(other)
        )
        assert second.returncode == 2 and "fsd started" not in second.stdout
        assert f"cannot bind {ep}: Address already in use" in second.stderr
        assert "OLD LINE" not in second.stderr  # only what this start logged
        assert "Traceback" not in second.stderr
        # one error line, the last (a slow machine may show the start's progress first)
        lines = second.stderr.strip().splitlines()
        assert [x for x in lines if x.startswith("error:")] == lines[-1:]
        assert pid_alive(pid)  # the serving daemon is untouched
    finally:
        stopped = fsd("stop", "--endpoint", ep, "--state-dir", str(tmp_path / "a"))
        assert stopped.returncode == 0, stopped.stderr
        kill_quietly(pid)


def test_a_port_clash_in_the_foreground_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ep = f"tcp://127.0.0.1:{port}"
        proc = fsd(
            "start",
            "--foreground",
            "--endpoint",
            ep,
            "--telemetry-endpoint",
            f"tcp://127.0.0.1:{free_port()}",
            "--state-dir",
            str(tmp_path / "s"),
        )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: cannot bind {ep}: Address already in use "
        "(another fsd daemon or program listens there)"
    )
    assert not list((tmp_path / "s").glob("*.pid"))


def test_a_curve_daemon_starts_in_the_background_and_stops_with_operator_keys(tmp_path):
    keys = generate_keys(tmp_path / "keys", clients=1, operators=1)
    toml = tmp_path / "curve.toml"
    toml.write_text(
        f'[server]\ncurve_secret_key = "{keys["server_secret"]}"\n'
        f'curve_authorized_dir = "{keys["authorized"]}"\n'
        f'curve_operators_dir = "{keys["operators"]}"\n'
    )
    ep, tep = endpoints()
    state = tmp_path / "state"
    started = fsd(
        "start",
        "--config",
        str(toml),
        "--endpoint",
        ep,
        "--telemetry-endpoint",
        tep,
        "--state-dir",
        str(state),
        "--wait",
        "120",
    )
    pid = started_pid(started)
    try:
        server = ("--server-key", str(keys["server_public"]))
        st = fsd("status", "--endpoint", ep, *server, "--client-key", str(keys["client-1_secret"]))
        assert st.returncode == 0 and f"pid {pid} " in st.stdout and "role client" in st.stdout
        plain = fsd("status", "--endpoint", ep, "--timeout", "1", "--state-dir", str(state))
        assert plain.returncode == 2 and f"pid {pid} holds its pidfile (serving)" in plain.stderr
        # no state dir here, so no token: the operator key alone may stop it
        stopped = fsd(
            "stop", "--endpoint", ep, *server, "--client-key", str(keys["operator-1_secret"])
        )
        assert stopped.returncode == 0, stopped.stderr
        assert wait_gone(pid)
    finally:
        kill_quietly(pid)
