"""Who may talk to the daemon: loopback by default, CURVE keys for anything else.

A daemon bound beyond loopback without encryption would serve anyone who can reach
the port, so that is refused. With `curve_secret_key` set, the sockets encrypt and
the ZAP authenticator admits only clients whose public keys sit in
`curve_authorized_dir` (files made by `fsd keys generate`).
"""

from __future__ import annotations

import ipaddress
import shutil
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from fsd.config import ServerConfig
from fsd.errors import ConfigError


def is_loopback(endpoint: str) -> bool:
    """tcp://127.0.0.1:5557, tcp://localhost:1, tcp://[::1]:1, ipc://..., inproc://..."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # '*', an interface name or a host name


class Security:
    """Applies the server's CURVE settings to its sockets; None means plain loopback."""

    def __init__(self, ctx: zmq.Context, cfg: ServerConfig) -> None:
        self.auth: ThreadAuthenticator | None = None
        self._public: bytes | None = None
        self._secret: bytes | None = None
        exposed = [e for e in (cfg.endpoint, cfg.telemetry_endpoint) if not is_loopback(e)]
        if cfg.curve_secret_key is None:
            if exposed:
                raise ConfigError(
                    f"refusing to bind {', '.join(exposed)} beyond loopback without CURVE keys; "
                    "run `fsd keys generate DIR` and set curve_secret_key and "
                    "curve_authorized_dir"
                )
            return
        if cfg.curve_authorized_dir is None:
            raise ConfigError("curve_secret_key needs curve_authorized_dir (clients' public keys)")
        key_file = Path(cfg.curve_secret_key).expanduser()
        allowed = Path(cfg.curve_authorized_dir).expanduser()
        if not key_file.is_file():
            raise ConfigError(f"curve_secret_key {str(key_file)!r} does not exist")
        if not allowed.is_dir():
            raise ConfigError(f"curve_authorized_dir {str(allowed)!r} is not a directory")
        try:
            self._public, self._secret = zmq.auth.load_certificate(str(key_file))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read CURVE key {str(key_file)!r}: {exc}") from None
        if self._secret is None:
            raise ConfigError(f"{str(key_file)!r} holds no secret key (use the .key_secret file)")
        self.auth = ThreadAuthenticator(ctx)
        self.auth.start()
        self.auth.configure_curve(domain="*", location=str(allowed))

    @property
    def enabled(self) -> bool:
        return self.auth is not None

    def configure(self) -> Callable[[zmq.Socket], None] | None:
        """A function that makes a socket a CURVE server (None without keys)."""
        if not self.enabled:
            return None

        def apply(sock: zmq.Socket) -> None:
            sock.curve_secretkey = self._secret
            sock.curve_publickey = self._public
            sock.curve_server = True

        return apply

    def close(self) -> None:
        if self.auth is not None:
            self.auth.stop()


def generate_keys(directory: str | Path, clients: int = 1) -> dict[str, Path]:
    """Write a server key pair and `clients` client key pairs; authorize the clients.

    Layout: DIR/server.key(_secret), DIR/client-N.key(_secret), and DIR/authorized/
    holding the clients' public keys (point curve_authorized_dir there).
    """
    root = Path(directory).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    authorized = root / "authorized"
    authorized.mkdir(exist_ok=True)
    made: dict[str, Path] = {}
    _, secret = zmq.auth.create_certificates(str(root), "server")
    made["server_secret"] = Path(secret)
    made["server_public"] = Path(secret).with_suffix(".key")
    for i in range(1, clients + 1):
        public, secret = zmq.auth.create_certificates(str(root), f"client-{i}")
        shutil.copy(public, authorized / Path(public).name)
        made[f"client-{i}_secret"] = Path(secret)
    made["authorized"] = authorized
    return made
