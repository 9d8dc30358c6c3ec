"""The daemon log's audit lines: one per control action, naming who asked.

A control action changes the daemon for everyone (retune, drain, undrain, shutdown,
inject) or ends someone's job (abort). Once the daemon has done it, one INFO line on
the `fsd.audit` logger says what was done, with what (the changes, the job id, the
burst), and by whom: the caller's role, its connection (the ROUTER's routing id, as
hex, the same for every request of one connection) and its CURVE key when it has
one. A refused request gets no line: nothing changed, and its caller heard why.

    audit: retune policy=fcfs q1=0.005 by operator (connection 00b1c2d3e4, key K)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fsd.server.roles import Caller

log = logging.getLogger("fsd.audit")


def audit(caller: Caller, action: str, detail: str = "") -> None:
    """Log that `caller` had `action` done (`detail`: what it did, in a few words)."""
    log.info("audit: %s%s by %s", action, f" {detail}" if detail else "", who(caller))


def who(caller: Caller) -> str:
    """'operator (connection 00b1c2d3e4, key Abc...)': the role, then where it came from."""
    key = f", key {caller.user_id}" if caller.user_id else ""
    return f"{caller.role} (connection {caller.ident.hex() or '-'}{key})"


def settings(changes: Mapping[str, Any]) -> str:
    """'policy=fcfs quanta=0.01,0.02': a retune's changes as `fsctl retune` takes them."""
    return " ".join(
        f"{k}={','.join(map(str, v)) if isinstance(v, list | tuple) else v}"
        for k, v in changes.items()
    )
