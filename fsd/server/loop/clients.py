"""Client sessions: who owns each live job, which connection hears it, and the job caps.

Design: a job belongs to a session, never to a routing id. A session is made the
first time a connection speaks and gets an internal key that never leaves the
daemon (`Caller.ident`); its connection (the routing id the gate issued, see
`fsd.server.transport.gate`) only says where its replies go now. A client that says `Hello`
learns the session's secret and may move the session to a new connection by
presenting it; a request that carries a secret must carry its connection's.
Under CURVE a session also belongs to the key ZAP authenticated (the User-Id of
each frame): a frame from another key on the same routing id gets a new session.

Bounds: one session per open connection (the gate caps connections) plus the
detached ones, each forgotten `client_timeout` after it last spoke; a detached
session keeps the `Finished` of every job of its that ends meanwhile (its jobs are
bounded by `max_client_jobs`), all detached sessions' together within
`max_held_result_bytes` (past it a result is dropped and the Welcome names its job),
and `_OUTBOX_EXTRA` other late answers; the last `_GONE_KEPT` closed connections are
remembered, so a frame read after its connection closed still speaks for its session.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from fsd import protocol as P
from fsd.admission import check_room
from fsd.config import ServerConfig
from fsd.errors import FsdError
from fsd.server.roles import Caller

_OUTBOX_EXTRA = 64  # answers other than results kept for a detached session
_GONE_KEPT = 4096  # closed connections remembered for their late frames


class SessionError(FsdError):
    """A request carried a session secret that is not its connection's."""

    code = "bad-session"


@dataclass
class ClientState:
    """A client session: its connection (None while detached), its key, its live jobs."""

    key: bytes  # the daemon's own name for it (Caller.ident); never on the wire
    last_seen: float
    user_id: str | None = None  # the CURVE key ZAP authenticated (z85), None on loopback
    route: bytes | None = None  # the routing id of its connection now
    secret: str | None = None  # given in Welcome once it said Hello
    jobs: dict[str, str] = field(default_factory=dict)  # job_id -> req_id
    req_ids: set[str] = field(default_factory=set)  # the req_ids of `jobs`
    outbox: list[P.Reply] = field(default_factory=list)  # answers while detached
    chunks: dict[str, P.Chunk] = field(default_factory=dict)  # tokens while detached, per job
    held_bytes: int = 0  # of the results in `outbox` (`ClientBook.keep`)
    extra: int = 0  # answers in `outbox` that are not results
    dropped: list[str] = field(default_factory=list)  # req_ids whose results were dropped
    last_caller: Caller | None = field(default=None, repr=False, compare=False)  # (`caller`)

    def caller(self, role: str, user_id: str | None) -> Caller:
        """Who sends with `role` on this session: the same object while that holds
        (each of its jobs' owners keeps it: one, not one a job)."""
        last = self.last_caller
        if last is None or last.role != role or last.user_id != user_id:
            last = self.last_caller = Caller(self.key, role, user_id)
        return last

    def add(self, job_id: str, req_id: str) -> None:
        self.jobs[job_id] = req_id
        self.req_ids.add(req_id)

    def remove(self, job_id: str) -> None:
        req_id = self.jobs.pop(job_id, None)
        if req_id is not None:
            self.req_ids.discard(req_id)

    def keep(self, msg: P.Reply) -> None:
        """Hold an answer for the next connection: tokens merged into one chunk per
        live job, other answers as they are (a few; results: `ClientBook.keep`)."""
        if isinstance(msg, P.Tokens):
            for chunk in msg.chunks:
                self._merge(chunk)
        elif self.extra < _OUTBOX_EXTRA:
            self.extra += 1
            self.outbox.append(msg)

    def _merge(self, chunk: P.Chunk) -> None:
        held = self.chunks.get(chunk.job_id)
        if held is None:
            if chunk.job_id in self.jobs:
                self.chunks[chunk.job_id] = P.Chunk(
                    req_id=chunk.req_id,
                    job_id=chunk.job_id,
                    token_ids=list(chunk.token_ids),
                    text=chunk.text,
                    start=chunk.start,
                )
            return
        held.token_ids.extend(chunk.token_ids)
        held.text += chunk.text

    def take_held(self) -> list[P.Reply]:
        """What was held while detached, in order: the tokens, then the answers."""
        held: list[P.Reply] = [P.Tokens(chunks=list(self.chunks.values()))] if self.chunks else []
        held += self.outbox
        self.chunks, self.outbox, self.extra = {}, [], 0
        return held


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose a job is and how it is answered: streamed tokens, or only its `Finished`."""

    caller: Caller
    req_id: str
    stream: bool = True


def result_bytes(msg: P.Finished) -> int:
    """About what a held result costs: its tokens, their times, its text."""
    timings = msg.timings.token_times if msg.timings is not None else None
    return 256 + 32 * len(msg.token_ids) + 24 * len(timings or ()) + len(msg.text)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


class ClientBook:
    """The sessions, the connection each is on, and the owner of each live job."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.clients: dict[bytes, ClientState] = {}  # by session key
        self.routes: dict[bytes, bytes] = {}  # routing id -> session key
        self._by_secret: dict[bytes, bytes] = {}  # digest of a secret -> session key
        self.owners: dict[str, Owner] = {}
        self._live_by: dict[str, int] = {}  # live jobs by owner identity (Caller.identity)
        self._streamed: dict[str, int] = {}  # job_id -> output tokens routed so far
        self._keys = itertools.count(1)
        # closed connections' routing ids -> their sessions: a frame a client sent just
        # before closing (its jobs' aborts) may be read after the gate said it closed.
        # Routing ids are the gate's, never reused, so this is still that connection.
        self._gone: OrderedDict[bytes, bytes] = OrderedDict()
        self.held_bytes = 0  # results kept for detached sessions (`keep`)
        self.dropped_results = 0

    # ---- sessions and connections -----------------------------------------------------

    def heard(self, route: bytes, now: float, user_id: str | None) -> ClientState:
        """The session of connection `route` (a new one for a new connection, or for
        another CURVE key than the session's), marked as heard from now."""
        client = self.session_of(route)
        if client is not None and client.user_id != user_id:
            self.detach(route)
            client = None
        if client is None and route in self._gone:  # sent before its connection closed
            late = self.clients.get(self._gone[route])
            if late is not None and late.user_id == user_id:
                late.last_seen = now
                return late
        if client is None:
            key = b"s%d" % next(self._keys)
            client = self.clients[key] = ClientState(key, now, user_id, route)
            self.routes[route] = key
        client.last_seen = now
        return client

    def session_of(self, route: bytes) -> ClientState | None:
        key = self.routes.get(route)
        return self.clients.get(key) if key is not None else None

    def check(self, client: ClientState, presented: str | None) -> None:
        """Refuse a request whose session secret is not its connection's."""
        if presented is None:
            return
        if client.secret is None or not hmac.compare_digest(
            _digest(presented), _digest(client.secret)
        ):
            raise SessionError(
                "this request carries a session that is not this connection's; send Hello "
                "with it to resume that session here"
            )

    def hello(self, client: ClientState, presented: str | None, now: float) -> ClientState:
        """Answer Hello on `client`'s connection: resume the session `presented` names
        (same CURVE key) there, else give `client` its secret. The session now bound."""
        target = None
        if presented is not None:
            key = self._by_secret.get(_digest(presented))
            target = self.clients.get(key) if key is not None else None
            if target is not None and target.user_id != client.user_id:
                target = None
        if target is None or target is client:
            if client.secret is None:
                client.secret = secrets.token_urlsafe(32)
                self._by_secret[_digest(client.secret)] = client.key
            return client
        route = client.route
        assert route is not None
        self.detach(route)
        if not client.jobs and client.secret is None:
            self.forget(client.key)  # a fresh connection's empty session
        if target.route is not None:
            self.detach(target.route)  # the holder of the secret is the session now
        target.route = route
        target.last_seen = now
        self.routes[route] = target.key
        return target

    def keep(self, client: ClientState, msg: P.Reply) -> None:
        """Hold `msg` for detached `client`'s next connection: a result always, within
        `max_held_result_bytes` for all sessions together (past it, dropped and
        named in the Welcome); anything else as `ClientState.keep` bounds it."""
        if not isinstance(msg, P.Finished):
            client.keep(msg)
            return
        size = result_bytes(msg)
        if self.held_bytes + size > self.cfg.max_held_result_bytes:
            client.dropped.append(msg.req_id)
            self.dropped_results += 1
            return
        self.held_bytes += size
        client.held_bytes += size
        client.outbox.append(msg)

    def take_held(self, client: ClientState) -> tuple[list[P.Reply], list[str]]:
        """What `client` held while detached, and the req_ids whose results were dropped."""
        self.held_bytes -= client.held_bytes
        client.held_bytes = 0
        dropped, client.dropped = client.dropped, []
        return client.take_held(), dropped

    def detach(self, route: bytes) -> None:
        """Connection `route` is closed or taken over: its session keeps its jobs until
        resumed or forgotten, and hears nothing meanwhile."""
        key = self.routes.pop(route, None)
        if key is not None:
            self._gone[route] = key
            while len(self._gone) > _GONE_KEPT:
                self._gone.popitem(last=False)
        client = self.clients.get(key) if key is not None else None
        if client is not None and client.route == route:
            client.route = None

    def closed(self, route: bytes) -> bool:
        """Whether connection `route` has closed (its frames may still be read)."""
        return route in self._gone and route not in self.routes

    def forget(self, key: bytes) -> None:
        """Drop a session whose jobs are gone (reaped or never had any)."""
        client = self.clients.pop(key, None)
        if client is None:
            return
        self.held_bytes -= client.held_bytes
        if client.route is not None and self.routes.get(client.route) == key:
            del self.routes[client.route]
        if client.secret is not None:
            self._by_secret.pop(_digest(client.secret), None)

    # ---- jobs ------------------------------------------------------------------------

    def own(self, job_id: str, caller: Caller, req_id: str, stream: bool = True) -> None:
        """`job_id` is `caller`'s session's: streamed to it (or only finished), reaped with it."""
        self.owners[job_id] = Owner(caller, req_id, stream)
        who = caller.identity
        self._live_by[who] = self._live_by.get(who, 0) + 1
        client = self.clients.get(caller.ident)
        if client is not None:
            client.add(job_id, req_id)

    def streamed(self, job_id: str, count: int) -> int:
        """Count `count` more tokens routed for `job_id`; how many came before them."""
        before = self._streamed.get(job_id, 0)
        self._streamed[job_id] = before + count
        return before

    def owner_of(self, job_id: str) -> Caller | None:
        owner = self.owners.get(job_id)
        return owner.caller if owner is not None else None

    def release(self, job_id: str) -> Owner | None:
        """Forget an ended job; its owner (None when nobody owned it) is answered."""
        owner = self.owners.pop(job_id, None)
        self._streamed.pop(job_id, None)
        if owner is not None:
            who = owner.caller.identity
            left = self._live_by.get(who, 0) - 1
            if left > 0:
                self._live_by[who] = left
            else:
                self._live_by.pop(who, None)
            client = self.clients.get(owner.caller.ident)
            if client is not None:
                client.remove(job_id)
        return owner

    def check_room(self, caller: Caller, count: int, live: int) -> None:
        """Refuse `count` more jobs past the caller's identity's cap (its CURVE key's
        jobs over all its connections and sessions, else its session's) or the
        daemon's (`live` now)."""
        mine = self._live_by.get(caller.identity, 0)
        who = "CURVE key" if caller.user_id is not None else "session"
        check_room(count, mine, live, self.cfg.max_client_jobs, self.cfg.max_jobs, who)

    def silent_since(self, limit: float) -> list[tuple[bytes, ClientState]]:
        """The sessions not heard from since `limit` (a wall time)."""
        return [(k, c) for k, c in self.clients.items() if c.last_seen < limit]
