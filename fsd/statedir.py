"""The state folder's trust rule: no other local user can steer what fsd does there.

The daemon keeps its pidfile (also its lock), its log file and its operator token in
`state_dir`, and `fsd stop`, `fsd status` and `fsctl` trust what they find there. A
folder someone else may write lets them plant a file or a symbolic link where fsd
writes (a link at the pidfile makes a root daemon overwrite the link's target) or
reads (a pidfile naming any process for `fsd stop` to signal). So the rule, checked
by `check_state_dir` before the daemon writes anything there and before a command
trusts a file there:

* the folder is owned by this user (the effective uid) or by root, and
* nobody else may write it: no group- or other-write bit, *with or without the
  sticky bit* (a shared folder such as /tmp is refused too: the simplest strict
  rule; point state_dir at a private folder instead, fsd creates a missing one 0700).

A folder that breaks it is refused with one line naming the folder, its mode, its
owner and the fix (`chmod 700 DIR`, or set state_dir elsewhere); fsd never changes
the mode of a folder it did not create. Each file fsd opens there (`open_state_file`)
is opened with O_NOFOLLOW and refused unless it is a regular file owned by this user,
so even a file root left there is never followed, truncated or read; a file fsd
creates there is created with O_CREAT|O_EXCL (only a file that already exists is
opened without O_EXCL, and then checked). Secrets are
written through a temporary file created O_EXCL under a random name
(`fsd.credentials.write_secret`). The folder's parents are not checked.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

from fsd.errors import ConfigError

_FIX = "or set state_dir to a folder only you may write"
_FIX_OTHER = "or use a folder only you may write"


def _owner(uid: int) -> str:
    """`name (uid N)`, or `uid N` for a uid without a name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_state_dir(path: str | Path, what: str = "state_dir") -> Path:
    """Refuse a folder another user may steer (the rule in the module docstring).

    Returns the folder; a missing one passes (there is nothing in it to trust).
    `what` names the folder in the error (a secret's folder is held to the same rule).
    """
    folder = Path(path).expanduser()
    fix = _FIX if what == "state_dir" else _FIX_OTHER
    try:
        st = folder.stat()
    except FileNotFoundError:
        return folder
    except OSError as exc:
        raise ConfigError(f"{what} {str(folder)!r} cannot be read: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {str(folder)!r} is not a folder; {fix}")
    mode, me = stat.S_IMODE(st.st_mode), os.geteuid()
    if st.st_uid not in (me, 0):
        raise ConfigError(
            f"{what} {str(folder)!r} (mode {mode:04o}) is owned by {_owner(st.st_uid)}, "
            f"not by you ({_owner(me)}): refused; {fix}"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"{what} {str(folder)!r} is writable by other users (mode {mode:04o}, owner "
            f"{_owner(st.st_uid)}): refused; run `chmod 700 {folder}` {fix}"
        )
    return folder


def ensure_state_dir(path: str | Path, what: str = "state_dir") -> Path:
    """The folder, created 0700 (with its parents) if missing, then checked."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return check_state_dir(folder, what)


def open_state_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """os.open(path) in a checked folder, never through a link, only a file of ours.

    ConfigError for a symbolic link, a file that is not regular or one owned by
    another user (it is not opened, or closed at once: never written nor truncated);
    other OSErrors pass through. Pass O_TRUNC only where clearing the file is meant.
    """
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a planted FIFO cannot block us
    try:
        fd = _open_new_or_old(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"{path} is a symbolic link: fsd never follows links in its state folder; remove it"
            ) from None
        raise
    try:
        _check_own_file(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd


def _open_new_or_old(path: Path, flags: int, mode: int) -> int:
    """os.open, creating with O_EXCL when O_CREAT is asked: a new file is made here and
    now, an old one is opened as it is (O_NOFOLLOW: a link at `path` is ELOOP)."""
    if not flags & os.O_CREAT:
        return os.open(path, flags, mode)
    for _ in range(3):  # it may vanish between the two opens (a stale pidfile removed)
        try:
            return os.open(path, flags | os.O_EXCL, mode)
        except FileExistsError:
            pass
        try:
            return os.open(path, flags & ~os.O_CREAT, mode)
        except FileNotFoundError:
            continue
    return os.open(path, flags & ~os.O_CREAT, mode)


def _check_own_file(path: Path, st: os.stat_result) -> None:
    """Refuse a state file that is not a regular file owned by this user."""
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path} is not a regular file: refused; remove it")
    me = os.geteuid()
    if st.st_uid != me:
        raise ConfigError(
            f"{path} is owned by {_owner(st.st_uid)}, not by you ({_owner(me)}): refused; remove it"
        )
