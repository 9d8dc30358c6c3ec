"""A fresh daemon for one benchmark setting: its own process, loopback ports and state dir.

The benchmarks that measure the real engine (bench/slo.py, bench/whatif.py) give each
setting a new `fsd start --foreground` (nothing carried over: KV pools, profile
calibration, queues); the process is stopped with SIGTERM (drain) and killed if it
does not exit (`fsd.daemon_control.stop_process`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fsd.client import Client
from fsd.config import ServerConfig
from fsd.daemon import probe_pidfile, state_files
from fsd.daemon_control import last_message, stop_process
from fsd.errors import FsdError
from fsd.progress import Progress


class BenchDaemonError(FsdError):
    """A benchmark daemon did not start or answer."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class DaemonSpec:
    """`fsd start` flags of a benchmark daemon (None: the daemon's default)."""

    policy: str
    model: str = "tiny"
    device: str | None = None
    kv_policy: str | None = None
    max_batch_size: int | None = None
    num_gpu_blocks: int | None = None
    num_host_blocks: int | None = None
    profile: str | None = None
    config: str | None = None
    telemetry_hz: float = 10.0

    def flags(self) -> list[str]:
        named = {
            "--policy": self.policy,
            "--model": self.model,
            "--device": self.device,
            "--kv-policy": self.kv_policy,
            "--max-batch-size": self.max_batch_size,
            "--num-gpu-blocks": self.num_gpu_blocks,
            "--num-host-blocks": self.num_host_blocks,
            "--profile": self.profile,
            "--config": self.config,
            "--telemetry-hz": self.telemetry_hz,
        }
        return [a for k, v in named.items() if v is not None for a in (k, str(v))]


@dataclass
class BenchDaemon:
    """A running benchmark daemon; use as a context manager."""

    spec: DaemonSpec
    endpoint: str = ""
    telemetry: str = ""
    proc: subprocess.Popen | None = None
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    def __enter__(self) -> BenchDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def state_dir(self) -> Path:
        """The daemon's own state folder (pidfile, operator token)."""
        assert self._tmp is not None
        return Path(self._tmp.name)

    @property
    def log_path(self) -> Path:
        return self.state_dir / "daemon.log"

    def start(self, wait: float = 300.0) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="fsd-bench-")
        self.endpoint = f"tcp://127.0.0.1:{_free_port()}"
        self.telemetry = f"tcp://127.0.0.1:{_free_port()}"
        cmd = [sys.executable, "-m", "fsd.cli", "start", "--foreground"]
        cmd += ["--endpoint", self.endpoint, "--telemetry-endpoint", self.telemetry]
        cmd += ["--state-dir", self._tmp.name, *self.spec.flags()]
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ)
        # ready when its pidfile names it as serving (as `fsd start` waits): a probe on
        # the socket could be answered by another program that took the port meanwhile
        pidfile, _ = state_files(
            ServerConfig(
                endpoint=self.endpoint, telemetry_endpoint=self.telemetry, state_dir=self._tmp.name
            )
        )
        deadline = time.time() + wait
        with Progress(f"starting the {self.spec.policy} daemon", transient=True) as bar:
            while time.time() < deadline:
                held, info = probe_pidfile(pidfile)
                if held and info.get("pid") == self.proc.pid and info.get("state") == "serving":
                    return
                if self.proc.poll() is not None:
                    raise BenchDaemonError(
                        f"the {self.spec.policy} daemon exited {self.proc.returncode}:\n"
                        + self.log_path.read_text()[-2000:]
                    )
                bar.update(info=last_message(self.log_path))
                time.sleep(0.1)
        self.stop()
        raise BenchDaemonError(f"the {self.spec.policy} daemon did not answer in {wait:g} s")

    def wait_idle(self, timeout: float = 120.0) -> None:
        """Until the daemon holds no job (between two rates)."""
        deadline = time.time() + timeout
        with Client(self.endpoint, timeout=10.0) as c:
            while time.time() < deadline:
                if c.status().jobs == 0:
                    return
                time.sleep(0.2)
        raise BenchDaemonError(f"the {self.spec.policy} daemon still has jobs after {timeout:g} s")

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
