"""Secret files: the operator token and CURVE secret keys, private to their owner.

A secret is written 0600 inside a folder only its owner may write (`fsd.statedir`'s
rule; a folder fsd creates is 0700), atomically: a temporary file created afresh
(O_EXCL, O_NOFOLLOW, a random name: never a file someone planted) renamed into place.
It is refused when read if group or others may read it, as ssh refuses a private key
that others can read. The operator token of a daemon lives in its state
folder, named after its endpoint like the pidfile: `fsctl` and `fsd stop` find it
there, so the user who started the daemon is its operator and nobody else is.

A token file outlives a daemon killed with SIGKILL. A client trusts it only while a
daemon holds the pidfile's lock beside it (`fsd.pidfile`): else it would hand a dead
daemon's secret to whatever listens on the endpoint now. A starting daemon removes
the old file as soon as it holds the lock, and writes its own new token once its
sockets are up; a token is never accepted by another daemon than the one that drew it.
"""

from __future__ import annotations

import errno
import fcntl
import hmac
import os
import re
import secrets
import stat
from pathlib import Path

from fsd.errors import ConfigError
from fsd.statedir import check_state_dir, ensure_state_dir, open_state_file

TOKEN_ENV = "FSD_TOKEN"  # an operator token given directly (overrides the token file)
_TEMP_TRIES = 16  # random temporary names tried before giving up (a clash is ~never)


def state_stem(endpoint: str) -> str:
    """The name a daemon's state files share: tcp://127.0.0.1:5557 -> fsd-tcp-127.0.0.1-5557."""
    return "fsd-" + re.sub(r"[^A-Za-z0-9.]+", "-", endpoint).strip("-")


def token_path(state_dir: str | Path, endpoint: str) -> Path:
    """Where the daemon serving `endpoint` keeps its operator token."""
    return Path(state_dir).expanduser() / f"{state_stem(endpoint)}.token"


def daemon_holds_lock(token: Path) -> bool:
    """Whether a live daemon holds the pidfile lock beside `token` (same name, .pid)."""
    try:
        fd = open_state_file(token.with_suffix(".pid"), os.O_RDONLY)
    except (OSError, ConfigError):  # no pidfile, or one never to be trusted
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock if we took it
    return False


def write_secret(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to `path` readable by its owner only (0600), replacing it atomically.

    ConfigError if the folder breaks `fsd.statedir`'s rule (it is created 0700 if missing).
    """
    target = Path(path).expanduser()
    ensure_state_dir(target.parent, "folder")
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = _new_temp(target)
    try:
        try:
            os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _new_temp(target: Path) -> tuple[int, Path]:
    """(fd, path) of a new 0600 file beside `target` under a random name: never an old file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TEMP_TRIES):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue  # a name clash (or a planted file): draw another name
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(target.parent))


def check_private(path: str | Path, what: str = "secret file") -> None:
    """Refuse a secret that group or others may read or write (name the fix)."""
    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{what} {str(p)!r} cannot be read: {exc.strerror}") from None
    _check_mode(p, mode, what)


def _check_mode(p: Path, mode: int, what: str) -> None:
    """Refuse a secret whose `mode` lets group or others read or write it."""
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{what} {str(p)!r} is readable by others (mode {stat.S_IMODE(mode):04o}); "
            f"run `chmod 600 {p}`"
        )


def read_secret(path: str | Path, what: str = "secret file") -> str:
    """The text of a private secret file (stripped); ConfigError if missing or exposed."""
    p = Path(path).expanduser()
    check_private(p, what)
    try:
        return p.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {str(p)!r} cannot be read: {exc}") from None


def new_token() -> str:
    """A fresh operator token: 256 random bits, hex."""
    return secrets.token_hex(32)


def same_token(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; no token never matches."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def find_operator_token(
    endpoint: str, state_dir: str | Path | None = None, token_file: str | Path | None = None
) -> str | None:
    """The operator token a client on this machine should present, or None.

    `FSD_TOKEN` wins; then `token_file`; then the daemon's own file in `state_dir`
    (default the daemon's default state folder). A missing file means no token (the
    client has the plain client role); a file others can read is an error, and so is
    a state folder others may steer, or a link or another user's file at the token's
    path (`fsd.statedir`: read through one, the token could be any file of ours). A
    token file no live daemon stands behind (its pidfile lock is free) is ignored.
    """
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    if token_file is not None:
        return read_secret(token_file, "operator token file")
    if state_dir is None:
        from fsd.config import ServerConfig

        state_dir = ServerConfig().state_dir
    path = token_path(state_dir, endpoint)
    check_state_dir(path.parent)
    token = _read_state_token(path)
    return token if token is not None and daemon_holds_lock(path) else None


def _read_state_token(path: Path) -> str | None:
    """The token in the state folder's file (not through a link, ours only), or None."""
    what = "operator token file"
    try:
        fd = open_state_file(path, os.O_RDONLY)
    except (FileNotFoundError, PermissionError):
        return None  # no daemon of ours there, or another user's: the plain client role
    except OSError as exc:
        raise ConfigError(f"{what} {str(path)!r} cannot be read: {exc.strerror}") from None
    with open(fd, "rb") as f:
        _check_mode(path, os.fstat(fd).st_mode, what)
        try:
            return f.read().decode().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{what} {str(path)!r} cannot be read: {exc}") from None
