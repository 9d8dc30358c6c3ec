"""Process life of the daemon: foreground serving, background start, stop, pidfile, logs.

`fsd start` re-runs itself as `fsd start --foreground` in a new session (so it
outlives the shell), with stdout and stderr in a log file, then waits until the
daemon answers a Status request; if the child dies first, its log tail is shown.
SIGTERM and SIGINT drain: no new jobs, in-flight jobs finish (up to a timeout),
then the process exits; a second signal stops at once.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from fsd.config import EngineConfig, ServerConfig
from fsd.errors import FsdError

log = logging.getLogger("fsd.daemon")
DRAIN_TIMEOUT = 30.0


class DaemonError(FsdError):
    """The daemon could not be started, reached or stopped."""


def state_files(cfg: ServerConfig) -> tuple[Path, Path]:
    """(pidfile, logfile) for the daemon serving cfg.endpoint."""
    root = Path(cfg.state_dir).expanduser()
    name = re.sub(r"[^A-Za-z0-9.]+", "-", cfg.endpoint).strip("-")
    return root / f"fsd-{name}.pid", root / f"fsd-{name}.log"


def read_pidfile(cfg: ServerConfig) -> dict | None:
    pidfile, _ = state_files(cfg)
    try:
        info = json.loads(pidfile.read_text())
    except (OSError, ValueError):
        return None
    return info if _alive(info.get("pid", -1)) else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- foreground --------------------------------------------------------------------


def serve_foreground(engine_cfg: EngineConfig, server_cfg: ServerConfig) -> None:
    """Load the model and serve until shut down (what systemd or a container runs)."""
    from fsd.engine.core import Engine
    from fsd.server.service import EngineService

    running = read_pidfile(server_cfg)
    if running is not None and running["pid"] != os.getpid():
        raise DaemonError(f"a daemon (pid {running['pid']}) already serves {server_cfg.endpoint}")
    engine = Engine(engine_cfg)
    service = EngineService(engine, server_cfg)
    pidfile, logfile = state_files(server_cfg)
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "endpoint": server_cfg.endpoint,
                "telemetry_endpoint": server_cfg.telemetry_endpoint,
                "log": str(logfile),
                "model": engine.loaded.source,
                "started": time.time(),
            }
        )
    )
    signals = {"count": 0}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals["count"] += 1
        drain = signals["count"] == 1
        log.info("signal %d: %s", signum, "draining" if drain else "stopping now")
        service.begin_shutdown(drain=drain, timeout=DRAIN_TIMEOUT)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        service.run()
    finally:
        info = read_pidfile(server_cfg)
        if info is not None and info.get("pid") == os.getpid():
            pidfile.unlink(missing_ok=True)
        log.info("stopped")


# ---- background control ------------------------------------------------------------


def start_background(argv: list[str], server_cfg: ServerConfig, wait: float = 300.0) -> int:
    """Spawn `fsd start --foreground ARGV` detached; return its pid once it answers."""
    from fsd.client import Client, DaemonUnavailable

    running = read_pidfile(server_cfg)
    if running is not None:
        raise DaemonError(f"a daemon (pid {running['pid']}) already serves {server_cfg.endpoint}")
    pidfile, logfile = state_files(server_cfg)
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fsd.cli", "start", "--foreground", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.time() + wait
    with Client(server_cfg.endpoint, timeout=1.0) as client:
        while time.time() < deadline:
            if proc.poll() is not None:
                raise DaemonError(
                    f"the daemon exited with code {proc.returncode} while starting; "
                    f"last lines of {logfile}:\n{_tail(logfile)}"
                )
            try:
                client.status()
                return proc.pid
            except DaemonUnavailable:
                continue
    proc.terminate()
    raise DaemonError(f"the daemon did not answer within {wait:.0f} s; see {logfile}")


def stop(server_cfg: ServerConfig, timeout: float = DRAIN_TIMEOUT) -> int | None:
    """Ask the daemon to drain and exit; SIGTERM, then SIGKILL, if it does not."""
    from fsd.client import Client, DaemonUnavailable

    info = read_pidfile(server_cfg)
    pid = info["pid"] if info else None
    try:
        with Client(server_cfg.endpoint, timeout=5.0) as client:
            client.shutdown(drain=True, timeout=timeout)
    except DaemonUnavailable:
        if pid is None:
            raise DaemonError(f"no fsd daemon runs for {server_cfg.endpoint}") from None
        os.kill(pid, signal.SIGTERM)
    if pid is None:
        return None
    for sig in (None, signal.SIGKILL):
        if sig is not None:
            os.kill(pid, sig)
        deadline = time.time() + timeout + 5.0
        while time.time() < deadline:
            if not _alive(pid):
                return pid
            time.sleep(0.1)
    raise DaemonError(f"pid {pid} did not exit")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
