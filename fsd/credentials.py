"""Secret files: the operator token and CURVE secret keys, private to their owner.

A secret is written 0600 inside a 0700 folder (atomically: a temporary file renamed
into place), and refused when read if group or others may read it, as ssh refuses a
private key that others can read. The operator token of a daemon lives in its state
folder, named after its endpoint like the pidfile: `fsctl` and `fsd stop` find it
there, so the user who started the daemon is its operator and nobody else is.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import stat
from pathlib import Path

from fsd.errors import ConfigError

TOKEN_ENV = "FSD_TOKEN"  # an operator token given directly (overrides the token file)


def state_stem(endpoint: str) -> str:
    """The name a daemon's state files share: tcp://127.0.0.1:5557 -> fsd-tcp-127.0.0.1-5557."""
    return "fsd-" + re.sub(r"[^A-Za-z0-9.]+", "-", endpoint).strip("-")


def token_path(state_dir: str | Path, endpoint: str) -> Path:
    """Where the daemon serving `endpoint` keeps its operator token."""
    return Path(state_dir).expanduser() / f"{state_stem(endpoint)}.token"


def private_dir(path: str | Path) -> Path:
    """Create `path` (and parents) if missing; a folder we create is 0700."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def write_secret(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to `path` readable by its owner only (0600), replacing it atomically."""
    target = Path(path).expanduser()
    private_dir(target.parent)
    raw = data.encode() if isinstance(data, str) else data
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask cannot widen it, an old file cannot keep its mode
        os.write(fd, raw)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    return target


def check_private(path: str | Path, what: str = "secret file") -> None:
    """Refuse a secret that group or others may read or write (name the fix)."""
    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{what} {str(p)!r} cannot be read: {exc.strerror}") from None
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
    client has the plain client role); a file others can read is an error.
    """
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    if token_file is not None:
        return read_secret(token_file, "operator token file")
    if state_dir is None:
        from fsd.config import ServerConfig

        state_dir = ServerConfig().state_dir
    path = token_path(state_dir, endpoint)
    if not path.is_file() or not os.access(path, os.R_OK):
        return None  # no daemon of ours there, or another user's: the plain client role
    return read_secret(path, "operator token file")
