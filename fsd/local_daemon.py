"""Whether any daemon can answer at a local endpoint, known at once instead of after --timeout.

A client asks and waits (`fsctl --timeout`, 10 s) because a daemon may be far away,
busy, or still loading its model. On this machine the answer is certain at once when
two things agree: no process holds the pidfile lock of the endpoint in the state
folder (no daemon of it runs or is starting: `fsd.pidfile`), and nothing listens at
the endpoint (a loopback TCP port refuses a connection, an ipc:// path has no socket
that accepts one). Neither alone would do: a daemon started with another state_dir
holds no lock here but listens; a daemon loading its model holds its lock but does
not listen yet. Any other endpoint (another host, a host name) keeps the wait.
"""

from __future__ import annotations

import socket
from pathlib import Path

from fsd.client.errors import DaemonUnavailable
from fsd.config_checks import loopback_host
from fsd.credentials import state_stem
from fsd.errors import ConfigError
from fsd.pidfile import probe_pidfile

_CONNECT_TIMEOUT = 0.5  # seconds: a loopback connect is answered in microseconds


def _address(endpoint: str) -> tuple[int, object] | None:
    """(socket family, address) of a local endpoint; None for any other."""
    if endpoint.startswith("ipc://"):
        path = endpoint.removeprefix("ipc://")
        return socket.AF_UNIX, "\0" + path[1:] if path.startswith("@") else path
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not port.isdigit() or not loopback_host(host):
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, ("127.0.0.1" if host == "localhost" else host, int(port))


def _nothing_listens(family: int, address: object) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(_CONNECT_TIMEOUT)
        try:
            s.connect(address)
        except (ConnectionRefusedError, FileNotFoundError):
            return True
        except OSError:  # unknown (a timeout, no permission): not certain
            return False
    return False


def _lock_held(endpoint: str, state_dir: str) -> bool:
    pidfile = Path(state_dir).expanduser() / f"{state_stem(endpoint)}.pid"
    try:
        return probe_pidfile(pidfile)[0]
    except ConfigError:  # a file fsd will not read: not certain
        return True


def nothing_serves(endpoint: str, state_dir: str | None = None) -> bool:
    """True only when no daemon can answer at `endpoint`: it is local, no daemon holds
    its pidfile in `state_dir` (default: the config's), and nothing listens there."""
    where = _address(endpoint)
    if where is None:
        return False
    if state_dir is None:
        from fsd.config import ServerConfig

        state_dir = ServerConfig().state_dir
    if _lock_held(endpoint, state_dir) or not _nothing_listens(*where):
        return False
    # a daemon may have taken its lock between the two looks; it binds next
    return not _lock_held(endpoint, state_dir)


def check_daemon(endpoint: str, state_dir: str | None, timeout: float) -> None:
    """Raise DaemonUnavailable at once, when `nothing_serves`, instead of waiting
    `timeout` seconds for it: the exit status is the wait's, the message says why."""
    try:
        gone = nothing_serves(endpoint, state_dir)
    except OSError:  # the state folder cannot be read: ask the socket as before
        gone = False
    if gone:
        raise DaemonUnavailable(
            f"no fsd daemon answered at {endpoint}: none runs there (nothing listens and "
            "no daemon holds its pidfile); start one with `fsd start`"
        )
