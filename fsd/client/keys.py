"""CURVE keys of a client, and the one place a client socket connects (with them)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
import zmq.utils.z85

from fsd.credentials import check_private
from fsd.errors import ConfigError


@dataclass(frozen=True)
class CurveKeys:
    """CURVE keys of a client: each a z85 string (40 chars) or a key file path.

    Files are those of `zmq.auth.create_certificates` / `fsd keys generate`:
    `server.key` for `server_public`, `client-1.key_secret` for `client_secret`
    (which also holds the client's public key, so `client_public` may be None).
    """

    server_public: str | Path
    client_public: str | Path | None = None
    client_secret: str | Path | None = None

    def resolve(self) -> tuple[bytes, bytes, bytes]:
        """(server public, client public, client secret) as z85 bytes."""
        server = _load_key(self.server_public, "server_public", secret=False)
        if self.client_secret is None:
            raise ConfigError("CurveKeys needs client_secret (a z85 key or a .key_secret file)")
        secret = _load_key(self.client_secret, "client_secret", secret=True)
        if self.client_public is None:
            public = zmq.curve_public(secret)
        else:
            public = _load_key(self.client_public, "client_public", secret=False)
        return server, public, secret


def apply_curve(sock: zmq.Socket, keys: tuple[bytes, bytes, bytes] | None) -> None:
    """Make `sock` a CURVE client of the daemon (`keys` from `CurveKeys.resolve`)."""
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys


def _load_key(value: str | Path, name: str, *, secret: bool) -> bytes:
    text = str(value)
    path = Path(text).expanduser()
    if len(text) == 40 and not path.exists():
        key = text.encode("ascii", "replace")
        try:
            if len(zmq.utils.z85.decode(key)) == 32:
                return key
        except (ValueError, KeyError, IndexError):
            pass
        raise ConfigError(f"{name} is neither a z85 CURVE key nor a key file: {text!r}")
    if not path.is_file():
        raise ConfigError(f"{name}: key file {str(path)!r} does not exist")
    try:
        public, secret_key = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{name}: cannot read CURVE key file {str(path)!r}: {exc}") from None
    if secret and secret_key is None:
        raise ConfigError(f"{name}: {str(path)!r} holds no secret key (use the .key_secret file)")
    if secret:
        check_private(path, f"{name}: CURVE secret key file")
    return secret_key if secret else public


def connect(
    ctx: zmq.Context, kind: int, endpoint: str, keys: tuple[bytes, bytes, bytes] | None
) -> zmq.Socket:
    """A socket of `kind` connected to `endpoint`: linger 0, CURVE client with keys."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    # its own id: libzmq then never makes one up for it (fsd.server.transport.zmtp)
    if kind == zmq.DEALER:
        sock.setsockopt(zmq.ROUTING_ID, b"fsd-" + secrets.token_bytes(12))
    apply_curve(sock, keys)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(f"cannot connect to {endpoint!r}: {exc}") from None
    return sock
