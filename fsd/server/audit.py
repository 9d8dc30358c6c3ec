"""The daemon log's audit lines: one per control action, naming who asked.

A control action changes the daemon for everyone (retune, drain, undrain, shutdown,
inject) or ends someone's job (abort). Once the daemon has done it, one INFO line on
the `fsd.audit` logger says what was done, with what (the changes, the job id, the
burst), and by whom: the caller's role, its session (the daemon's own number for
it, the same for every request of one client, `fsd.server.loop.clients`) and its CURVE
key when it has one. A refused request gets no line: nothing changed, and its caller
heard why. No log line names a routing id: where one must be told apart (a dropped
reply) `connection_tag` gives a short keyed hash of it instead.

    audit: retune policy=fcfs q1=0.005 by operator (session 3, key K)
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from fsd.server.roles import Caller

log = logging.getLogger("fsd.audit")
_TAG_KEY = secrets.token_bytes(16)  # per process: a tag names a connection, never its id


def audit(caller: Caller, action: str, detail: str = "") -> None:
    """Log that `caller` had `action` done (`detail`: what it did, in a few words)."""
    log.info("audit: %s%s by %s", action, f" {detail}" if detail else "", who(caller))


def who(caller: Caller) -> str:
    """'operator (session 3, key Abc...)': the role, then which client it was."""
    key = f", key {caller.user_id}" if caller.user_id else ""
    return f"{caller.role} (session {session_number(caller.ident)}{key})"


def session_number(ident: bytes) -> str:
    """'3' for the session key b"s3" (`fsd.server.loop.clients`); a tag for anything else."""
    if ident[:1] == b"s" and ident[1:].isdigit():
        return ident[1:].decode()
    return connection_tag(ident)


def connection_tag(route: bytes) -> str:
    """A short name for a routing id in the log: 8 hex digits of a keyed hash (the id
    itself never reaches the log)."""
    return hashlib.blake2b(route, digest_size=4, key=_TAG_KEY).hexdigest()


def settings(changes: Mapping[str, Any]) -> str:
    """'policy=fcfs quanta=0.01,0.02': a retune's changes as `fsctl retune` takes them."""
    return " ".join(
        f"{k}={','.join(map(str, v)) if isinstance(v, list | tuple) else v}"
        for k, v in changes.items()
    )
