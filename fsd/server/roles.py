"""Who may do what: the client and operator roles of the daemon's requests.

Design: a role is decided per request, never per connection, so there is no session
to hijack. A request has the operator role when it carries the daemon's operator
token (a random secret written 0600 into the state folder at start, which only the
user who started the daemon can read) or arrives over a CURVE connection whose key
is listed in `curve_operators_dir`. Everyone else is a client: it may submit, read
the job table and status, and abort the jobs its own connection (or CURVE key) made.
Retune, preview, inject, drain, undrain, shutdown and aborting another client's job
need the operator role.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.credentials import new_token, same_token, token_path, write_secret
from fsd.errors import ConfigError, ForbiddenError
from fsd.printable import check_name
from fsd.statedir import open_state_file

log = logging.getLogger("fsd.server")

CLIENT = "client"
OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: its connection, its role, and its CURVE key (None without).

    `identity`: who the caller is for job caps and turns (fsd.sched.fair_share): whom
    an operator relays for, else its CURVE key, else its session (all its connections).
    A session key never leaves the daemon. One string for all of a session's jobs
    (each job's owner holds it: interned, not one copy a job)."""

    ident: bytes
    role: str = CLIENT
    user_id: str | None = None
    on_behalf: str | None = None  # whom an operator relays a job for (`relayed`)
    identity: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.on_behalf is not None:
            who = f"relay:{self.on_behalf}"
        else:
            who = self.user_id if self.user_id is not None else self.ident.decode("latin-1")
        object.__setattr__(self, "identity", sys.intern(who))

    def relayed(self, owner: str | None) -> Caller:
        """The caller a `Submit` naming `owner` is admitted as: an operator relaying
        others' requests (the HTTP API names each peer's address) may name whose job it
        is, for caps and turns; a client may not (ForbiddenError)."""
        if owner is None:
            return self
        if self.role != OPERATOR:
            raise ForbiddenError(needs_operator("naming a job's owner"))
        if not 0 < len(owner) <= P.MAX_AFFINITY_CHARS:
            raise ConfigError(f"owner must be 1 to {P.MAX_AFFINITY_CHARS} characters")
        check_name("owner", owner)
        return dataclasses.replace(self, on_behalf=owner)

    def owns(self, owner: Caller | None) -> bool:
        """Whether a job made by `owner` is this caller's (same connection or same key)."""
        if owner is None:
            return False
        if owner.ident == self.ident:
            return True
        return owner.user_id is not None and owner.user_id == self.user_id


# requests that change the daemon for everyone
_OPERATOR_ONLY: dict[type, str] = {
    P.Retune: "retune",
    P.Preview: "preview",
    P.Inject: "inject",
    P.Drain: "drain",
    P.Undrain: "undrain",
    P.Shutdown: "shutdown",
}


class Authorizer:
    """The daemon's operator token and operator keys; decides each request's role."""

    def __init__(self, cfg: ServerConfig, operator_keys: frozenset[str] = frozenset()) -> None:
        self.operator_keys = operator_keys
        self.token = new_token()
        self.token_file: Path = token_path(cfg.state_dir, cfg.endpoint)
        try:
            write_secret(self.token_file, self.token + "\n")
        except OSError as exc:
            raise ConfigError(
                f"cannot write the operator token {str(self.token_file)!r}: {exc.strerror} "
                "(set state_dir to a folder this user may write)"
            ) from None

    def role(self, msg: P.Request, user_id: str | None) -> str:
        """OPERATOR for the token's holder or an operator CURVE key, else CLIENT."""
        if same_token(msg.token, self.token):
            return OPERATOR
        if user_id is not None and user_id in self.operator_keys:
            return OPERATOR
        return CLIENT

    def check(self, msg: P.Request, role: str) -> None:
        """Raise ForbiddenError when `msg` needs the operator role and `role` lacks it."""
        what = _OPERATOR_ONLY.get(type(msg))
        if what is not None and role != OPERATOR:
            raise ForbiddenError(needs_operator(what))

    def close(self) -> None:
        """Remove the token file, unless another daemon has replaced it since (read
        as every state file is: never through a link, only a file of ours)."""
        try:
            fd = open_state_file(self.token_file, os.O_RDONLY)
        except (OSError, ConfigError):
            return
        try:
            if os.pread(fd, 4096, 0).decode(errors="replace").strip() == self.token:
                self.token_file.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)


def needs_operator(what: str) -> str:
    """The refusal's text: what was refused and how to get the role."""
    return (
        f"{what} needs the operator role: present the daemon's operator token (fsctl reads "
        "it from the daemon's state folder; --token-file or FSD_TOKEN otherwise) or connect "
        "with a CURVE key listed in curve_operators_dir"
    )
