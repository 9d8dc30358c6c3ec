"""Client bookkeeping: the connected clients, whose each live job is, and the job caps."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsd.config import ServerConfig
from fsd.errors import OverloadedError
from fsd.server.roles import Caller


@dataclass
class ClientState:
    """A connected client: when it last spoke and which of its jobs are live."""

    last_seen: float
    user_id: str | None = None  # its CURVE key (z85), None on plain loopback
    jobs: dict[str, str] = field(default_factory=dict)  # job_id -> req_id
    req_ids: set[str] = field(default_factory=set)  # the req_ids of `jobs`

    def add(self, job_id: str, req_id: str) -> None:
        self.jobs[job_id] = req_id
        self.req_ids.add(req_id)

    def remove(self, job_id: str) -> None:
        req_id = self.jobs.pop(job_id, None)
        if req_id is not None:
            self.req_ids.discard(req_id)


@dataclass(frozen=True)
class Owner:
    """Whose a job is and how it is answered: streamed tokens, or only its `Finished`."""

    caller: Caller
    req_id: str
    stream: bool = True


class ClientBook:
    """The clients the daemon has heard from and the owner of each live job."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.clients: dict[bytes, ClientState] = {}
        self.owners: dict[str, Owner] = {}

    def heard(self, ident: bytes, now: float, user_id: str | None) -> ClientState:
        """The client `ident` (new ones with their CURVE key), marked as heard from now."""
        client = self.clients.get(ident)
        if client is None:
            client = self.clients[ident] = ClientState(now, user_id)
        client.last_seen = now
        return client

    def own(self, job_id: str, caller: Caller, req_id: str, stream: bool = True) -> None:
        """`job_id` is `caller`'s: streamed to it (or only finished), reaped with it."""
        self.owners[job_id] = Owner(caller, req_id, stream)
        client = self.clients.get(caller.ident)
        if client is not None:
            client.add(job_id, req_id)

    def owner_of(self, job_id: str) -> Caller | None:
        owner = self.owners.get(job_id)
        return owner.caller if owner is not None else None

    def release(self, job_id: str) -> Owner | None:
        """Forget an ended job; its owner (None when nobody owned it) is answered."""
        owner = self.owners.pop(job_id, None)
        if owner is not None:
            client = self.clients.get(owner.caller.ident)
            if client is not None:
                client.remove(job_id)
        return owner

    def check_room(self, ident: bytes, count: int, live: int) -> None:
        """Refuse `count` more jobs past the caller's or the daemon's (`live` now) cap."""
        client = self.clients.get(ident)
        mine = len(client.jobs) if client is not None else 0
        if mine + count > self.cfg.max_client_jobs:
            raise OverloadedError(
                f"this connection has {mine} live jobs; max_client_jobs is "
                f"{self.cfg.max_client_jobs}"
            )
        if live + count > self.cfg.max_jobs:
            raise OverloadedError(
                f"the daemon holds {live} live jobs; max_jobs is {self.cfg.max_jobs}"
            )

    def silent_since(self, limit: float) -> list[tuple[bytes, ClientState]]:
        """The clients not heard from since `limit` (a wall time)."""
        return [(i, c) for i, c in self.clients.items() if c.last_seen < limit]
