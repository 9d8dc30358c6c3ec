"""A real fsd daemon process on free loopback ports, for integration tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq

from fsd import protocol as P
from fsd.client import Client, CurveKeys, DaemonUnavailable
from fsd.credentials import find_operator_token
from fsd.daemon_control import DRAIN_TIMEOUT, stop_process


def pool_config(gpu_blocks: int, max_batch_size: int, telemetry_hz: float, **server: object) -> str:
    """A daemon's TOML: a device pool of `gpu_blocks` (host 256), a batch limit, the
    telemetry rate and any other [server] settings."""
    extra = "".join(f"{k} = {v!r}\n" for k, v in server.items())
    return (
        f"[cache]\nnum_gpu_blocks = {gpu_blocks}\nnum_host_blocks = 256\n"
        f"[sched]\nmax_batch_size = {max_batch_size}\n"
        f"[server]\ntelemetry_hz = {telemetry_hz}\n{extra}"
    )


# a daemon small enough to preempt and swap with a handful of jobs, telemetry at 20 Hz
SMALL_POOL = pool_config(64, 8, 20)

# a scenario of 1.5 s for a test that plays or injects one: Poisson arrivals, one burst
SMALL_SCENARIO = """
[scenario]
name = "small"
seed = 11
duration = 1.5

[[phase]]
arrival = "poisson"
rate = 8.0
lengths = { prompt = { dist = "lognormal", mean = 20, sigma = 0.3 }, output = 6 }

[[event]]
at = 0.5
kind = "burst"
count = 3
prompt_len = 30
output_len = 4
"""


def curve_daemon(
    tmp: Path, keys: dict[str, Path], who: str, config: str = "", operators: bool = False
) -> Daemon:
    """A daemon that requires CURVE (`keys` from fsd.server.security.generate_keys,
    `operators`: with its operators' folder), `config` added to its [server] section;
    it is waited for with `who`'s keys ("client-1", "operator-1")."""
    lines = [
        f'curve_secret_key = "{keys["server_secret"]}"',
        f'curve_authorized_dir = "{keys["authorized"]}"',
    ]
    if operators:
        lines.append(f'curve_operators_dir = "{keys["operators"]}"')
    text = "[server]\n" + "\n".join(lines) + "\n" + config
    creds = CurveKeys(
        server_public=str(keys["server_public"]), client_secret=str(keys[f"{who}_secret"])
    )
    return start_daemon(tmp, text, curve=creds)


def raw(d: Daemon) -> zmq.Socket:
    """A bare DEALER connected to the daemon: frames exactly as a test writes them."""
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(d.endpoint)
    return s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Daemon:
    proc: subprocess.Popen
    endpoint: str
    telemetry: str
    state_dir: Path
    log: Path

    curve: CurveKeys | None = None

    @property
    def token(self) -> str | None:
        """The daemon's operator token (its state folder's token file)."""
        return find_operator_token(self.endpoint, self.state_dir)

    def client(self, timeout: float = 10.0, operator: bool = True) -> Client:
        """A client; with the operator role unless `operator` is False."""
        token = self.token if operator else None
        return Client(self.endpoint, timeout=timeout, curve=self.curve, token=token)

    def snapshot(self, timeout: float = 10.0) -> P.Snapshot:
        """The next telemetry snapshot."""
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, P.TOPIC_SNAPSHOT)
        sub.connect(self.telemetry)
        try:
            deadline = time.time() + timeout
            while time.time() < deadline:
                if sub.poll(200):
                    _, payload = sub.recv_multipart()
                    return P.decode_snapshot(payload)
            raise TimeoutError("no snapshot")
        finally:
            sub.close()

    def stop(self, timeout: float = DRAIN_TIMEOUT + 60.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`: more than the daemon's own drain limit,
        so a daemon still finishing jobs on a loaded machine exits by itself (0)."""
        return stop_process(self.proc, timeout)


def start_daemon(
    tmp: Path,
    config: str = "",
    *flags: str,
    wait: float = 120.0,
    curve: CurveKeys | None = None,
    endpoints: tuple[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    module: str = "fsd.cli",
    cwd: Path | None = None,
) -> Daemon:
    """Start `fsd start --foreground` with an fsd.toml holding `config`; wait until it answers
    (to a client holding `curve` keys, when the daemon requires them). `endpoints`:
    (endpoint, telemetry endpoint) to serve on, else free loopback ports; `preexec`:
    run in the child before it starts (a resource limit); `module`: what `python -m`
    runs (a test's wrapper of fsd.cli that adds a hook); `cwd`: its working folder (an
    fsd tree of another commit, with PYTHONPATH in `env`: bench/abuse.py)."""
    endpoint, telemetry = endpoints or (
        f"tcp://127.0.0.1:{free_port()}",
        f"tcp://127.0.0.1:{free_port()}",
    )
    state = tmp / "state"
    toml = tmp / "fsd.toml"
    toml.write_text(config)
    log = tmp / "daemon.log"
    cmd = [
        sys.executable,
        "-m",
        module,
        "start",
        "--foreground",
        "--config",
        str(toml),
        "--endpoint",
        endpoint,
        "--telemetry-endpoint",
        telemetry,
        "--state-dir",
        str(state),
        *flags,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec, cwd=cwd
        )
    d = Daemon(proc, endpoint, telemetry, state, log, curve)
    deadline = time.time() + wait
    try:
        with Client(endpoint, timeout=1.0, curve=curve) as c:
            while time.time() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"daemon exited {proc.returncode}:\n{log.read_text()}")
                try:
                    c.status()
                    return d
                except DaemonUnavailable:
                    continue
    except BaseException:  # a client that cannot even be made must not leak the daemon
        d.stop()
        raise
    d.stop()
    raise RuntimeError(f"daemon did not answer:\n{log.read_text()}")


def daemon_fixture(config: str, name: str, http: bool = False):  # noqa: ANN201
    """A module-scoped pytest fixture: one daemon per test module, stopped cleanly after.

    `http`: also serve the OpenAI-compatible API on a free port (its base URL is
    `daemon.http`).
    """
    import pytest

    @pytest.fixture(scope="module")
    def daemon(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN202
        flags: tuple[str, ...] = ()
        port = free_port()
        if http:
            flags = ("--http", f"127.0.0.1:{port}")
        d = start_daemon(tmp_path_factory.mktemp(name), config, *flags)
        if http:
            d.http = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        yield d
        assert d.stop() == 0

    return daemon
