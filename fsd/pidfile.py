"""The daemon's pidfile: its lock, what it says, and the error the daemon's files raise.

The pidfile is also the daemon's lock. A daemon holds an exclusive `flock` on it for
its whole life, so "a daemon runs here" means "the lock is held", never "some process
has the pid written in the file" (pids are reused: a stale pidfile may name an
unrelated process, which `fsd stop` must never signal). The kernel drops the lock
when the process dies, however it dies. The file says `"state": "starting"` while the
model loads and `"serving"` once the sockets are bound and signals are handled.

The pidfile and the log file live in the state folder and are held to
`fsd.statedir`'s rule: the folder is checked before anything is written there, and
neither file is ever opened through a symbolic link or when another user owns it.
Before `fsd stop` signals the pid a pidfile names, `check_lock_holder` asks the
kernel (/proc/locks) whether that very process holds the file's lock and checks
that it runs as this user: a pidfile is only words, the lock is the proof. Then
`check_daemon_process` reads the process's command line (/proc/PID/cmdline): it must
be an fsd `start --foreground` whose state folder is this pidfile's, as its
`--state-dir` names it (resolved in the process's own working folder) and as the
daemon recorded it in the pidfile (`state_dir`, resolved at start). A lock holder
that is anything else (a process that inherited the lock, a reused pid /proc/locks
still names, a daemon of another state folder) gets no signal.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from fsd.config import ServerConfig
from fsd.credentials import state_stem
from fsd.errors import FsdError
from fsd.statedir import ensure_state_dir, open_state_file

_LOCK_RETRY = 1.0  # seconds a starting daemon retries the lock (a reader may hold it briefly)


class DaemonError(FsdError):
    """The daemon could not be started, reached or stopped (the `fsd` command's own
    error: it never travels on the wire)."""

    code: ClassVar[str] = "daemon"


def state_files(cfg: ServerConfig) -> tuple[Path, Path]:
    """(pidfile, logfile) for the daemon serving cfg.endpoint."""
    root = Path(cfg.state_dir).expanduser()
    stem = state_stem(cfg.endpoint)
    return root / f"{stem}.pid", root / f"{stem}.log"


# ---- the lock ------------------------------------------------------------------------


def probe_pidfile(pidfile: Path) -> tuple[bool, dict[str, Any]]:
    """(whether a live daemon holds `pidfile`'s lock, what the file says).

    Takes the shared lock for an instant: it is free unless a daemon holds it.
    ConfigError for a link or another user's file at the path (never read).
    """
    try:
        fd = open_state_file(pidfile, os.O_RDONLY)
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
        fd = open_state_file(pidfile, os.O_RDONLY)
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


def open_state(path: Path, flags: int, mode: int = 0o644) -> int:
    """Open a file of the state folder (made 0700 if missing); DaemonError if we may not.

    ConfigError for a folder another user may steer, or a link or another user's
    file at `path` (`fsd.statedir`): nothing is written then.
    """
    try:
        ensure_state_dir(path.parent)
        return open_state_file(path, flags, mode)
    except OSError as exc:
        raise DaemonError(
            f"cannot open {path}: {exc.strerror} (set state_dir to a folder this user may write)"
        ) from None


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` (not followed if a link) is the file open as `fd`."""
    try:
        st = os.stat(path, follow_symlinks=False)
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
            fd = open_state(pidfile, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = _parse(os.pread(fd, 1 << 16, 0))  # through the fd: never a link
                os.close(fd)
                if time.monotonic() < deadline:  # maybe a reader's instant: try again
                    time.sleep(0.02)
                    continue
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


# ---- who holds the lock ---------------------------------------------------------------


def lock_holders(pidfile: Path) -> set[int] | None:
    """The pids holding an exclusive flock on `pidfile` (from /proc/locks); None if unknown."""
    try:
        st = os.stat(pidfile, follow_symlinks=False)
        with open("/proc/locks") as f:
            text = f.read()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    return {pid for pid, where in _flock_writers(text) if where == want}


def _flock_writers(text: str) -> Iterator[tuple[int, tuple[int, int, int]]]:
    """(pid, (major, minor, inode)) of each exclusive flock /proc/locks lists.

    A line reads `1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF` (major and minor
    in hex); a waiter's line has `->` after the number and is skipped, as are POSIX
    and OFD locks and shared (READ) flocks.
    """
    for line in text.splitlines():
        f = line.split()
        if len(f) < 6 or f[1] != "FLOCK" or f[3] != "WRITE":
            continue
        try:
            major, minor, ino = f[5].split(":")
            yield int(f[4]), (int(major, 16), int(minor, 16), int(ino))
        except ValueError:
            continue


def check_lock_holder(pidfile: Path, pid: int, holders: set[int] | None) -> None:
    """Refuse (DaemonError) to trust `pid` unless it holds `pidfile`'s lock and is ours.

    `holders` is what `lock_holders` found. ProcessLookupError if `pid` is gone.
    """
    if holders is None:
        raise DaemonError(
            f"cannot tell which process holds {pidfile} (no /proc/locks): "
            f"not signalling pid {pid}; stop it yourself if it is the daemon"
        )
    if pid not in holders:
        who = ", ".join(f"pid {p}" for p in sorted(holders)) or "no process visible here"
        raise DaemonError(
            f"pidfile {pidfile} names pid {pid}, but its lock is held by {who}: "
            "signalled nothing (a pidfile the daemon did not write?)"
        )
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    me = os.geteuid()
    if me != 0 and owner != me:
        raise DaemonError(
            f"pid {pid} (holding {pidfile}) runs as uid {owner}, not as you (uid {me}): "
            "signalled nothing"
        )


def check_daemon_process(pidfile: Path, pid: int, info: dict[str, Any]) -> None:
    """Refuse (DaemonError) to signal `pid` unless it is an fsd daemon of this state folder.

    `info` is what the pidfile says. ProcessLookupError if `pid` is gone.
    """
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    except OSError as exc:
        raise DaemonError(
            f"cannot read the command line of pid {pid} (holding {pidfile}): {exc.strerror}: "
            "signalled nothing"
        ) from None
    argv = [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]
    args = fsd_args(argv)
    shown = " ".join(argv)[:200]
    if args is None or args[:1] != ["start"] or "--foreground" not in args:
        raise DaemonError(
            f"pid {pid} holds the lock of {pidfile} but is not an fsd daemon "
            f"(its command line: {shown!r}): signalled nothing"
        )
    folder = pidfile.parent.resolve()
    named = option_value(args, "--state-dir")
    claims = [Path(cwd, Path(named).expanduser()) if named is not None else None]
    claims.append(Path(info["state_dir"]) if isinstance(info.get("state_dir"), str) else None)
    if claims == [None, None]:
        raise DaemonError(
            f"pid {pid} is an fsd daemon but neither its command line nor {pidfile} says "
            "which state folder it serves: signalled nothing"
        )
    for claim in filter(None, claims):
        if claim.resolve() != folder:
            raise DaemonError(
                f"pid {pid} holds the lock of {pidfile} but is the fsd daemon of state_dir "
                f"{str(claim)!r}, not {str(folder)!r}: signalled nothing"
            )


def fsd_args(argv: list[str]) -> list[str] | None:
    """The arguments after the program if `argv` runs fsd (`fsd ...`, `python [-X dev]
    -m fsd.cli ...`, `python /venv/bin/fsd ...`), else None."""
    if argv and os.path.basename(argv[0]) == "fsd":
        return argv[1:]
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[i + 2 :] if argv[i + 1 : i + 2] == ["fsd.cli"] else None
        if arg == "-c" or not arg.startswith("-"):  # the code or the script python runs
            return argv[i + 1 :] if os.path.basename(arg) == "fsd" else None
        i += 2 if arg in ("-X", "-W") else 1  # the interpreter's options with a value
    return None


def option_value(args: list[str], name: str) -> str | None:
    """The last value of option `name` in `args` (`--name V` or `--name=V`), as click reads it."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
    return value
