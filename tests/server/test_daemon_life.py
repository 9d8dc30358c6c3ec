"""Process life: SIGTERM drains, fsd start/stop/status, loopback-only without CURVE."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from fsd.client import Client, CurveKeys, DaemonUnavailable
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
    assert st.returncode == 0 and "model preset:tiny" in st.stdout and "policy sj-mlfq" in st.stdout
    again = fsd("start", "--endpoint", ep, "--telemetry-endpoint", tep, "--state-dir", state)
    assert again.returncode == 2 and "already serves" in again.stderr
    stopped = fsd("stop", "--endpoint", ep, "--state-dir", state)
    assert stopped.returncode == 0, stopped.stderr
    gone = fsd("status", "--endpoint", ep, "--timeout", "1")
    assert gone.returncode == 2 and "no fsd daemon answered" in gone.stderr


def test_binding_beyond_loopback_without_keys_is_refused():
    proc = fsd("start", "--foreground", "--endpoint", f"tcp://0.0.0.0:{free_port()}")
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
