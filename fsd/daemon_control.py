"""Background control from the `fsd` command: start a detached daemon, stop one.

`fsd start` re-runs itself as `fsd start --foreground` in a new session (so it
outlives the shell), with stdout and stderr appended to a log file, and waits until
the pidfile names the child and says it serves (showing, past a few seconds, what
the daemon logs meanwhile: loading the model, measuring its cost): no socket probe,
so it needs no keys and a daemon of someone else answering on the endpoint cannot be
mistaken for ours.
If the child exits first, its error (from the lines it wrote during this start) is
shown. `fsd stop` asks the daemon to drain on its socket, then signals the pid its
held pidfile names, once the kernel confirms that this process holds the lock
(`fsd.pidfile.check_lock_holder`) and its command line shows an fsd daemon of this
state folder (`fsd.pidfile.check_daemon_process`). Both refuse a state folder another user may
steer (`fsd.statedir`). `stop_process` ends a daemon that the caller started itself
(a benchmark's, a test's) by its process handle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fsd.config import ServerConfig
from fsd.pidfile import (
    DaemonError,
    check_daemon_process,
    check_lock_holder,
    lock_holders,
    open_state,
    probe_pidfile,
    remove_stale,
    state_files,
)
from fsd.progress import Progress
from fsd.statedir import check_state_dir, open_state_file

log = logging.getLogger("fsd.daemon")
DRAIN_TIMEOUT = 30.0
START_TIMEOUT = 300.0  # seconds `fsd start` waits for the model to load and the sockets to bind
_POLL = 0.1
# `fsd.daemon.setup_logging`'s "2025-01-02 10:11:12,345 INFO fsd.daemon: " before a message
_LOG_PREFIX = re.compile(r"\d{4}-\d\d-\d\d [\d:,.]+ [A-Z]+ [\w.]+: ")
_MESSAGE_CHARS = 80  # of the last log message shown beside the progress


def start_background(argv: list[str], server_cfg: ServerConfig, wait: float = START_TIMEOUT) -> int:
    """Spawn `fsd start --foreground ARGV` detached; return its pid once it serves."""
    pidfile, logfile = state_files(server_cfg)
    check_state_dir(pidfile.parent)
    held, info = probe_pidfile(pidfile)
    if held:
        who = f"a daemon (pid {info['pid']})" if info.get("pid") else "a daemon"
        raise DaemonError(f"{who} already serves {server_cfg.endpoint} (pidfile {pidfile})")
    log_fd = open_state(logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    os.fchmod(log_fd, 0o600)  # private, even if an older fsd made it 0644 (fsd.logfile)
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
    # quiet when it is quick: a failed start's error stays the one line on stderr
    with Progress("starting the daemon", transient=True, announce=False) as bar:
        while time.monotonic() < deadline:
            if serving():
                return proc.pid
            code = proc.poll()
            if code is not None:
                raise DaemonError(_start_failure(code, logfile, offset))
            bar.update(info=last_message(logfile, offset))
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


def last_message(path: Path, offset: int = 0) -> str:
    """The daemon's last log message from byte `offset` on, without its time and level:
    what a starting daemon does now (loading the model, measuring its cost)."""
    lines = [ln for ln in _new_lines(path, offset) if ln.strip()]
    if not lines:
        return ""
    prefix = _LOG_PREFIX.match(lines[-1])
    return lines[-1][prefix.end() if prefix else 0 :][:_MESSAGE_CHARS]


def _new_lines(path: Path, offset: int) -> list[str]:
    """The log's lines from byte `offset` on (none if it cannot be read safely)."""
    try:
        with open(open_state_file(path, os.O_RDONLY), "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").splitlines()
    except (OSError, ValueError):  # ConfigError: a link or another user's file now
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
    ConfigError for a state folder another user may steer; DaemonError, signalling
    nothing, if the pidfile names a process that does not hold its lock.
    """
    from fsd.client import Client, DaemonUnavailable, RequestError

    pidfile, _ = state_files(server_cfg)
    check_state_dir(pidfile.parent)
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
    """Send `sig` to the daemon that holds `pidfile` (nothing if none holds it).

    DaemonError, and no signal, unless the pid the file names holds its lock, runs
    as this user (`check_lock_holder`) and is an fsd daemon of this state folder
    (`check_daemon_process`).
    """
    for _ in range(2):  # a second look if the lock changed hands between the two reads
        holders = lock_holders(pidfile)  # first: a daemon exiting meanwhile is not held then
        held, info = probe_pidfile(pidfile)
        pid = info.get("pid")
        if not held or type(pid) is not int or pid <= 0:
            return
        if holders is None or pid in holders:
            break
    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
        check_lock_holder(pidfile, pid, holders)
        check_daemon_process(pidfile, pid, info)
        os.kill(pid, sig)


def stop_process(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM (the daemon drains), then SIGKILL if it has not exited in `timeout`;
    the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
