"""Who may talk to the daemon: loopback by default, CURVE keys for anything else.

A daemon bound beyond loopback without encryption would serve anyone who can reach
the port, so that is refused. With `curve_secret_key` set, the sockets encrypt and
the ZAP authenticator admits only clients whose public keys sit in
`curve_authorized_dir` or `curve_operators_dir` (files made by `fsd keys
generate`); the keys in the latter have the operator role. The server's secret key
must be private to its owner (0600), as ssh wants of a private key.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from fsd.config import ServerConfig
from fsd.credentials import check_private, write_secret
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
    """Applies the server's CURVE settings to its sockets; None means plain loopback.

    `operator_keys`: the z85 public keys of `curve_operators_dir`, which is what the
    ZAP authenticator gives as a CURVE connection's User-Id.
    """

    def __init__(self, ctx: zmq.Context, cfg: ServerConfig) -> None:
        self.auth: ThreadAuthenticator | None = None
        self.operator_keys: frozenset[str] = frozenset()
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
            if cfg.curve_operators_dir is not None:
                raise ConfigError(
                    "curve_operators_dir needs curve_secret_key (operator keys are CURVE keys; "
                    "on loopback the operator token in state_dir is the operator's credential)"
                )
            return
        if cfg.curve_authorized_dir is None:
            raise ConfigError("curve_secret_key needs curve_authorized_dir (clients' public keys)")
        key_file = Path(cfg.curve_secret_key).expanduser()
        if not key_file.is_file():
            raise ConfigError(f"curve_secret_key {str(key_file)!r} does not exist")
        check_private(key_file, "curve_secret_key")
        try:
            self._public, self._secret = zmq.auth.load_certificate(str(key_file))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read CURVE key {str(key_file)!r}: {exc}") from None
        if self._secret is None:
            raise ConfigError(f"{str(key_file)!r} holds no secret key (use the .key_secret file)")
        admitted = _public_keys(cfg.curve_authorized_dir, "curve_authorized_dir")
        if cfg.curve_operators_dir is not None:
            operators = _public_keys(cfg.curve_operators_dir, "curve_operators_dir")
            self.operator_keys = frozenset(k.decode("ascii") for k in operators)
            admitted |= operators  # an operator need not be listed twice
        self.auth = ThreadAuthenticator(ctx)
        self.auth.start()
        # the certificates are given directly (configure_curve would read one folder
        # and only log a bad file); the authenticator consults this dict per handshake
        self.auth.allow_any = False
        self.auth.certs["*"] = {key: True for key in admitted}

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


def _public_keys(folder: str, field: str) -> set[bytes]:
    """The z85 public keys of the `*.key` files in `folder`; ConfigError naming `field`."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{field} {str(path)!r} is not a directory")
    try:
        return set(zmq.auth.load_certificates(str(path)))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{field} {str(path)!r}: {exc}") from None


_BANNER = (
    "#   ****  Generated on {now} by fsd keys generate  ****\n"
    "#   ZeroMQ CURVE {kind} Certificate\n"
    "{warning}\n"
    "metadata\n"
    "curve\n"
    '    public-key = "{public}"\n'
)


def _key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """Write NAME.key (public, 0644) and NAME.key_secret (0600) in the zmq format.

    Written by hand rather than by `zmq.auth.create_certificates`, which creates the
    secret file with the umask's mode (0644 typically) before anyone can narrow it.
    """
    public, secret = zmq.curve_keypair()
    now = datetime.datetime.now().isoformat(timespec="seconds")
    text = _BANNER.format(
        now=now,
        kind="**Public**",
        warning="#   Exchange securely, "
        "or use a secure mechanism to verify the contents of this file.",
        public=public.decode(),
    )
    public_file = folder / f"{name}.key"
    _write_public(public_file, text)
    secret_text = (
        _BANNER.format(
            now=now,
            kind="**Secret**",
            warning="#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.",
            public=public.decode(),
        )
        + f'    secret-key = "{secret.decode()}"\n'
    )
    secret_file = write_secret(folder / f"{name}.key_secret", secret_text)
    return public_file, secret_file


def _write_public(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _private_folder(path: Path) -> Path:
    """`path` created if missing and made 0700 whatever the umask (it holds secrets)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def generate_keys(directory: str | Path, clients: int = 1, operators: int = 1) -> dict[str, Path]:
    """Write a server key pair, `clients` client and `operators` operator key pairs.

    Layout: DIR/server.key(_secret), DIR/client-N.key(_secret),
    DIR/operator-N.key(_secret); DIR/authorized/ holds every client's and operator's
    public key (point curve_authorized_dir there) and DIR/operators/ the operators'
    (curve_operators_dir). DIR and both folders are 0700, secret files 0600.
    """
    if clients < 0 or operators < 0:
        raise ConfigError(f"clients and operators must be >= 0, got {clients} and {operators}")
    root = _private_folder(Path(directory).expanduser())
    authorized = _private_folder(root / "authorized")
    operators_dir = _private_folder(root / "operators")
    made: dict[str, Path] = {}
    public, secret = _key_pair(root, "server")
    made["server_secret"] = secret
    made["server_public"] = public
    for i in range(1, clients + 1):
        public, secret = _key_pair(root, f"client-{i}")
        _write_public(authorized / public.name, public.read_text())
        made[f"client-{i}_secret"] = secret
    for i in range(1, operators + 1):
        public, secret = _key_pair(root, f"operator-{i}")
        _write_public(authorized / public.name, public.read_text())
        _write_public(operators_dir / public.name, public.read_text())
        made[f"operator-{i}_secret"] = secret
    made["authorized"] = authorized
    made["operators"] = operators_dir
    return made
