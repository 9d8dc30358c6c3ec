"""Process life of the daemon: foreground serving, background start, stop, pidfile, logs.

The pidfile is also the daemon's lock. A daemon holds an exclusive `flock` on it for
its whole life, so "a daemon runs here" means "the lock is held", never "some process
has the pid written in the file" (pids are reused: a stale pidfile may name an
unrelated process, which `fsd stop` must never signal). The kernel drops the lock
when the process dies, however it dies. The file says `"state": "starting"` while the
model loads and `"serving"` once the sockets are bound and signals are handled.

`fsd start` re-runs itself as `fsd start --foreground` in a new session (so it
outlives the shell), with stdout and stderr appended to a log file, and waits until
the pidfile names the child and says it serves: no socket probe, so it needs no keys
and a daemon of someone else answering on the endpoint cannot be mistaken for ours.
If the child exits first, its error (from the lines it wrote during this start) is
shown. SIGTERM and SIGINT drain: no new jobs, in-flight jobs finish (up to a
timeout), then the process exits; a second signal stops at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from fsd.config import EngineConfig, ServerConfig, parse_http_address
from fsd.credentials import private_dir, state_stem
from fsd.errors import FsdError

log = logging.getLogger("fsd.daemon")
DRAIN_TIMEOUT = 30.0
START_TIMEOUT = 300.0  # seconds `fsd start` waits for the model to load and the sockets to bind
_LOCK_RETRY = 1.0  # seconds a starting daemon retries the lock (a reader may hold it briefly)
_POLL = 0.1


class DaemonError(FsdError):
    """The daemon could not be started, reached or stopped."""


def state_files(cfg: ServerConfig) -> tuple[Path, Path]:
    """(pidfile, logfile) for the daemon serving cfg.endpoint."""
    root = Path(cfg.state_dir).expanduser()
    stem = state_stem(cfg.endpoint)
    return root / f"{stem}.pid", root / f"{stem}.log"


# ---- the pidfile lock ----------------------------------------------------------------


def probe_pidfile(pidfile: Path) -> tuple[bool, dict[str, Any]]:
    """(whether a live daemon holds `pidfile`'s lock, what the file says).

    Takes the shared lock for an instant: it is free unless a daemon holds it.
    """
    try:
        fd = os.open(pidfile, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False, {}
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            held = True
        else:
            held = False
            fcntl.flock(fd, fcntl.LOCK_UN)
        return held, _parse(os.pread(fd, 1 << 16, 0))
    finally:
        os.close(fd)


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        info = json.loads(raw)
    except ValueError:  # empty or half-written: the daemon is starting
        return {}
    return info if isinstance(info, dict) else {}


def read_pidfile(cfg: ServerConfig) -> dict[str, Any] | None:
    """What the pidfile of the daemon serving cfg.endpoint says, or None if none runs.

    A live daemon's file may still be empty for an instant after it took the lock
    (then the dict has no "pid").
    """
    held, info = probe_pidfile(state_files(cfg)[0])
    return info if held else None


def remove_stale(pidfile: Path) -> bool:
    """Remove `pidfile` if no daemon holds it (left by a killed one); True if removed."""
    try:
        fd = os.open(pidfile, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a daemon holds it: not stale
        if not _same_file(fd, pidfile):
            return False  # replaced meanwhile by a starting daemon: leave it
        pidfile.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def _open_state(path: Path, flags: int) -> int:
    """Open a file of the state folder (made 0700 if missing); DaemonError if we may not."""
    try:
        private_dir(path.parent)
        return os.open(path, flags, 0o644)
    except OSError as exc:
        raise DaemonError(
            f"cannot open {path}: {exc.strerror} (set state_dir to a folder this user may write)"
        ) from None


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


class PidLock:
    """The running daemon's pidfile, exclusively locked until `release` (or death)."""

    def __init__(self, pidfile: Path, endpoint: str) -> None:
        self.path = pidfile
        deadline = time.monotonic() + _LOCK_RETRY
        while True:
            fd = _open_state(pidfile, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() < deadline:  # maybe a reader's instant: try again
                    time.sleep(0.02)
                    continue
                try:
                    info = _parse(pidfile.read_bytes())
                except OSError:
                    info = {}
                who = f"a daemon (pid {info['pid']})" if info.get("pid") else "a daemon"
                raise DaemonError(f"{who} already serves {endpoint} (pidfile {pidfile})") from None
            # a stopping daemon unlinks its file while it holds the lock: if we locked
            # that unlinked file, the lock guards nothing; open the path again
            if _same_file(fd, pidfile):
                self.fd: int | None = fd
                return
            os.close(fd)

    def write(self, info: dict[str, Any]) -> None:
        """Replace the file's content (readers retry a half-written file)."""
        assert self.fd is not None
        data = json.dumps(info).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        """Remove the pidfile, then drop the lock (in that order: see __init__)."""
        if self.fd is None:
            return
        if _same_file(self.fd, self.path):
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None


# ---- foreground --------------------------------------------------------------------


def bind_error(address: str, exc: OSError | Exception) -> str:
    """One line for a socket that cannot be bound, naming the address and the likely cause."""
    code = getattr(exc, "errno", None)
    if code in errno.errorcode:  # the system's words (pyzmq's also repeat the address)
        reason = os.strerror(code)
    else:
        reason = getattr(exc, "strerror", None) or str(exc)
    if code == errno.EADDRINUSE:
        return f"cannot bind {address}: {reason} (another fsd daemon or program listens there)"
    return f"cannot bind {address}: {reason}"


def check_addresses(cfg: ServerConfig) -> None:
    """Refuse now what the service would refuse after the model loaded.

    ConfigError for the security settings (keys, loopback-only); DaemonError if a TCP
    endpoint or the HTTP address cannot be bound. So a busy port or a bad key fails
    in a second, not after a minute of loading, and the error names the address.
    (ipc:// is not checked: binding it would take the path over from its server.)
    """
    import zmq

    from fsd.server.security import Security, is_loopback

    ctx = zmq.Context()
    try:
        Security(ctx, cfg).close()  # keys, folders, loopback-only: refused before loading too
        for ep in (cfg.endpoint, cfg.telemetry_endpoint):
            if not ep.startswith("tcp://"):
                continue
            if not is_loopback(ep) and cfg.curve_secret_key is None:
                continue  # refused by the security check, not opened even for a moment
            sock = ctx.socket(zmq.PUB)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.bind(ep)
            except zmq.ZMQError as exc:
                raise DaemonError(bind_error(ep, exc)) from None
            finally:
                sock.close(linger=0)
    finally:
        ctx.term()
    if cfg.http is not None:
        host, port = parse_http_address(cfg.http)
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise DaemonError(f"cannot serve HTTP on {cfg.http}: {exc}") from None
        family, kind, proto, _, addr = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server does
            try:
                s.bind(addr)
            except OSError as exc:
                raise DaemonError(bind_error(f"http://{cfg.http}", exc)) from None


def _serve_on(engine: Any, cfg: ServerConfig) -> Any:
    """EngineService(engine, cfg), with a bind failure as one DaemonError line."""
    import zmq

    from fsd.server.service import EngineService

    try:
        return EngineService(engine, cfg)
    except zmq.ZMQError as exc:
        # a port taken since check_addresses (which names it); the service may hold
        # the other one by now, so checking again could blame the wrong address
        both = f"{cfg.endpoint} or {cfg.telemetry_endpoint}"
        raise DaemonError(bind_error(both, exc)) from None


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def serve_foreground(engine_cfg: EngineConfig, server_cfg: ServerConfig) -> None:
    """Load the model and serve until shut down (what systemd or a container runs)."""
    from fsd.engine.core import Engine

    pidfile, logfile = state_files(server_cfg)
    lock = PidLock(pidfile, server_cfg.endpoint)  # first: two starts never both load
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "state": "starting",
        "endpoint": server_cfg.endpoint,
        "telemetry_endpoint": server_cfg.telemetry_endpoint,
        "log": str(logfile),
    }
    try:
        lock.write(info)
        # until the service drains on a signal, one ends the start (the lock is released)
        signal.signal(signal.SIGTERM, _exit_on_signal)
        signal.signal(signal.SIGINT, _exit_on_signal)
        check_addresses(server_cfg)
        engine = Engine(engine_cfg)
        try:
            service = _serve_on(engine, server_cfg)
        except BaseException:
            engine.close()
            raise
        signals = {"count": 0}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            signals["count"] += 1
            drain = signals["count"] == 1
            log.info("signal %d: %s", signum, "draining" if drain else "stopping now")
            service.begin_shutdown(drain=drain, timeout=DRAIN_TIMEOUT)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # readiness: `fsd start` waits for exactly this (sockets bound, signals drain)
        lock.write(
            {**info, "state": "serving", "model": engine.loaded.source, "started": time.time()}
        )
        try:
            service.run()
        finally:
            log.info("stopped")
    finally:
        lock.release()


# ---- background control ------------------------------------------------------------


def start_background(argv: list[str], server_cfg: ServerConfig, wait: float = START_TIMEOUT) -> int:
    """Spawn `fsd start --foreground ARGV` detached; return its pid once it serves."""
    pidfile, logfile = state_files(server_cfg)
    held, info = probe_pidfile(pidfile)
    if held:
        who = f"a daemon (pid {info['pid']})" if info.get("pid") else "a daemon"
        raise DaemonError(f"{who} already serves {server_cfg.endpoint} (pidfile {pidfile})")
    log_fd = _open_state(logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC)
    offset = os.fstat(log_fd).st_size  # this start's lines follow
    with open(log_fd, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fsd.cli", "start", "--foreground", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def serving() -> bool:
        held, info = probe_pidfile(pidfile)
        return held and info.get("pid") == proc.pid and info.get("state") == "serving"

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if serving():
            return proc.pid
        code = proc.poll()
        if code is not None:
            raise DaemonError(_start_failure(code, logfile, offset))
        time.sleep(_POLL)
    if serving():  # never stop a daemon that made it
        return proc.pid
    proc.terminate()  # it never served: do not leave it loading in the background
    raise DaemonError(f"the daemon did not start within {wait:.0f} s (stopped it); see {logfile}")


def _start_failure(code: int, logfile: Path, offset: int) -> str:
    """Why the child exited: its `error:` line, else the tail of what it logged this time."""
    lines = _new_lines(logfile, offset)
    errors = [ln for ln in lines if ln.startswith("error:")]
    if errors:
        return f"the daemon did not start: {errors[-1].removeprefix('error:').strip()}"
    tail = "\n".join(lines[-20:]) or "(it wrote nothing)"
    return f"the daemon exited with code {code} while starting; its log ({logfile}) says:\n{tail}"


def _new_lines(path: Path, offset: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def stop(
    server_cfg: ServerConfig,
    timeout: float = DRAIN_TIMEOUT,
    curve: Any = None,
    token: str | None = None,
) -> int | None:
    """Ask the daemon to drain and exit; SIGTERM, then SIGKILL, if it does not.

    Signals go only to the pid a held pidfile lock names (that process is the
    daemon); a stale pidfile is removed. Without a held lock the daemon is still
    asked on its socket (one started with another state_dir, or a remote one with
    CURVE operator keys); then there is no pid to wait for and None is returned.
    """
    from fsd.client import Client, DaemonUnavailable, RequestError

    pidfile, _ = state_files(server_cfg)
    held, info = probe_pidfile(pidfile)
    if not held and remove_stale(pidfile):
        log.info("removed the stale pidfile %s", pidfile)
    pid = info.get("pid") if held else None
    asked = False
    try:
        # a short Status first: the Shutdown's own wait includes the whole drain
        with Client(
            server_cfg.endpoint, timeout=5.0 if held else 2.0, curve=curve, token=token
        ) as client:
            client.status()
            client.shutdown(drain=True, timeout=timeout)
        asked = True
    except DaemonUnavailable:
        if not held:
            hint = " (or it did not accept these CURVE keys)" if curve is not None else ""
            raise DaemonError(f"no fsd daemon runs for {server_cfg.endpoint}{hint}") from None
    except RequestError as exc:
        if not held:
            raise DaemonError(f"the daemon at {server_cfg.endpoint} refused: {exc}") from None
        log.info("the daemon refused to shut down (%s); sending SIGTERM", exc)
    if not held:
        return None
    if not asked:
        _signal(pidfile, signal.SIGTERM)
    for sig in (None, signal.SIGKILL):
        if sig is not None:
            _signal(pidfile, sig)
        deadline = time.monotonic() + (timeout + 5.0 if sig is None else 10.0)
        while time.monotonic() < deadline:
            if not probe_pidfile(pidfile)[0]:
                return pid
            time.sleep(_POLL)
    raise DaemonError(f"the daemon (pid {pid}) did not exit")


def _signal(pidfile: Path, sig: int) -> None:
    """Send `sig` to the daemon that holds `pidfile` (nothing if none holds it)."""
    held, info = probe_pidfile(pidfile)
    pid = info.get("pid")
    if not held or not isinstance(pid, int) or pid <= 0:
        return
    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
        os.kill(pid, sig)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
