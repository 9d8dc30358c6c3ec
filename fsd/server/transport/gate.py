"""The gate: a daemon's public endpoint, in front of its ROUTER (or telemetry PUB) socket.

Design: libzmq lets a peer choose its routing id, and a ROUTER that meets a chosen
id equal to one it generated aborts the process (`fsd.server.transport.zmtp`). So libzmq never
listens where peers can reach it: the ROUTER binds an `ipc://` path inside a folder
only the daemon's user may enter, and this gate listens on the public endpoint
(tcp:// or ipc://), relays each connection's bytes to that path, and on the way
replaces the routing id in the handshake with one it issues (`c` + a 64-bit
counter: unique per connection, never reused). A routing id therefore names one
connection and nothing else; who a caller is comes from its session or CURVE key
(`fsd.server.loop.clients`).

It also holds the connection table (`fsd.server.transport.slots`): a share per peer, slots
that make no use of themselves closed for newcomers, and a reserve only the operator
reaches (`fsd.server.transport.probation`); a newcomer refused gets an `Error`
"too-many-connections" (NULL; under CURVE it is closed). The file-descriptor limit
is raised to what the kernel allows at start; out of descriptors even so, its
listener refuses without spinning (`fsd.server.listen`).
Each connection is relayed by a `fsd.server.transport.relay.Relay` on the gate's own thread,
within byte budgets: client frames are counted in the inbound ledger and refused
(NULL: a stand-in answered "overloaded") or held back (CURVE: TCP backpressure) when
it is full; the upstream socket is read as fast as it writes into a per-connection
outbox, and a connection whose unsent bytes pass its budget (or the largest, when
all connections' pass `max_backlog`) is dropped. Under NULL the ROUTER's route for
a connection is the gate's routing id; under CURVE the handshake passes encrypted,
so the gate does not know which route is whose (only bytes are counted, which holds
alike). Closed connections are reported through `on_close(routing_id, why)` on the
gate's thread, `why` saying why the gate dropped it for its unread replies (None: it
closed, or the gate closed it for room: its session may resume). The same gate fronts
the telemetry PUB (`fsd.server.transport.endpoints`), admitting SUB and XSUB peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from fsd import protocol as P
from fsd.credentials import same_token
from fsd.errors import ConfigError
from fsd.server.audit import connection_tag
from fsd.server.listen import raise_fd_limit, tcp_listeners, unix_listener
from fsd.server.log_limits import Throttle
from fsd.server.loop_thread import LoopThread
from fsd.server.transport import zmtp
from fsd.server.transport.msgpack_peek import prefix_field, prefix_req_id
from fsd.server.transport.peers import peer_of
from fsd.server.transport.probation import FirstRequest, read_first, refuse
from fsd.server.transport.relay import Backlogs, Limits, Relay
from fsd.server.transport.slots import ConnectionTable, Slot, Verdict

log = logging.getLogger("fsd.server")

_FDS_PER_CONNECTION = 3  # the client's socket, the relay's ipc socket, libzmq's side of it
_FD_RESERVE = 256  # descriptors kept for the model, logs, HTTP and telemetry
_START_TIMEOUT = 10.0
_MAX_PROBATIONS = 256  # connections on probation at once; more are refused at once
_CLOSE_FLUSH = 2.0  # seconds closing waits for the ROUTER's last answers to reach peers
_TICK = 0.05  # seconds between the loop's marks of having relayed what it had read


def unpredictable_ids() -> None:
    """Seed the C library's rand() from the OS: libzmq's ROUTER starts the ids it makes
    up at rand()'s next value (0x6B8B4567 unseeded), which only matters where peers
    choose ids (CURVE, whose READY the gate cannot rewrite), and then a peer must guess."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).srand(ctypes.c_uint(int.from_bytes(os.urandom(4), "little")))


def connection_cap(configured: int, soft_limit: int) -> int:
    """How many connections the gate takes: the setting, or what the fds allow. Under a
    small limit the reserve is half of it (128 descriptors left one connection, which
    the HTTP frontend's link could hold, refusing every client)."""
    reserve = min(_FD_RESERVE, soft_limit // 2)
    return max(1, min(configured, (soft_limit - reserve) // _FDS_PER_CONNECTION))


def operator_reserve(cap: int) -> int:
    """The slots only the operator takes: a 64th of the table, at least one (never all)."""
    return min(max(1, cap // 64), cap - 1)


class Gate(LoopThread):
    """Relays the public endpoint to the upstream socket's private `ipc://` path
    (module doc); `limits`: its connections' peers and budgets (`fsd.server.transport.relay`)."""

    def __init__(
        self,
        endpoint: str,
        *,
        limits: Limits,
        max_connections: int,
        max_per_peer: int | None = None,
        max_backlog: int = 1 << 30,
        on_close: Callable[[bytes, str | None], None] = lambda rid, why: None,
        name: str = "requests",
    ) -> None:
        super().__init__(f"fsd-gate-{name}")
        self.endpoint = endpoint
        self.limits = limits
        self.curve = limits.curve
        self.name = name
        self.max_connections = cap = connection_cap(max_connections, raise_fd_limit()[1])
        self.table = ConnectionTable(cap, max_per_peer or cap, operator_reserve(cap))
        self.operator_token: str | None = None  # set once the daemon has made it
        # the daemon's own user on this machine (`fsd.server.transport.peers`): it can read the
        # token anyway, so it reaches the reserve without showing it
        self.local_operator = f"uid:{os.getuid()}"
        self.on_close = on_close
        self._dir = Path(tempfile.mkdtemp(prefix="fsd-gate-"))  # 0700, ours
        self.upstream_path = str(self._dir / "up")
        self.upstream = f"ipc://{self.upstream_path}"
        self.refused = 0
        self.dropped = 0  # connections dropped for their backlog
        self.probations = 0  # connections on probation now
        self._refusals = Throttle()  # the log's lines about refused connections
        self._reclaims = Throttle()  # ... and about connections closed for room
        self.backlogs = Backlogs(max_backlog)
        self._count = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._ticks = deque([time.time()] * 3, maxlen=3)

    @property
    def heard_until(self) -> float:
        """Up to when every byte clients sent has surely been passed upstream (read from
        any thread). A frame waits here while the gate's loop does not run (its thread
        starved of the GIL or the CPU): the session reaper counts a client's silence only
        up to here as well as up to `Frontend.caught_up`, or it would take the gate's
        stall for its clients' silence. The oldest of the last three ticks: bytes the
        kernel held then were read in that loop turn and written upstream in a later one."""
        return self._ticks[0]

    def start(self) -> None:
        """Listen on the public endpoint; ConfigError (naming it) if it cannot be bound."""
        error = self.start_thread(f"the gate on {self.endpoint}", _START_TIMEOUT)
        if error is not None:
            self.close()
            why = getattr(error, "strerror", None) or str(error)
            raise ConfigError(
                f"cannot bind {self.endpoint}: {why} (another fsd daemon or program listens there?)"
            )

    def close(self) -> None:
        self.signal_stop()
        if self._thread.is_alive():
            self._thread.join(5.0)
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def live(self) -> int:
        """Connections holding a slot now."""
        return len(self.table)

    def figures(self) -> dict[str, float]:
        """Its counters, for /metrics (read from another thread: plain ints)."""
        return {
            "dropped": float(self.dropped),
            "backlog": float(self.backlogs.total),
            "refused": float(self.refused),
            "reclaimed": float(self.table.reclaimed),
        }

    # ---- the thread ----------------------------------------------------------------

    async def serve(self) -> None:
        self._servers = await _listen(self.endpoint, self._serve)
        ticker = asyncio.create_task(self._tick())
        self.ready()
        try:
            await self.stopped()
        finally:
            ticker.cancel()
            for server in self._servers:
                server.close()
            # the upstream socket closed first (EngineService.close): each relay ends once
            # it has passed on what that socket flushed, e.g. the answer to Shutdown
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if tasks:
                await asyncio.wait(tasks, timeout=_CLOSE_FLUSH)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _tick(self) -> None:
        while True:
            self._ticks.append(time.time())
            await asyncio.sleep(_TICK)

    def _next_id(self) -> bytes:
        self._count += 1
        return b"c" + self._count.to_bytes(8, "big")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the gate closing
            peer = peer_of(writer.get_extra_info("socket"))
            verdict, why = self.table.admit(peer)
            if verdict is Verdict.OPEN:
                await self._relay(reader, writer, peer)
            elif verdict is Verdict.PROBATION:
                await self._probation(reader, writer, peer, why)
            else:
                await self._refuse(reader, writer, why)

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        first: FirstRequest | None = None,
        operator: bool = False,
    ) -> None:
        """Take a slot and relay the connection until it ends; `first`: what the gate
        read on probation (the handshake was answered here)."""
        rid = self._next_id() if first is None else first.rid
        up_writer: asyncio.StreamWriter | None = None
        why: str | None = None
        relay: Relay | None = None
        slot = Slot(rid, peer, _Opening(), operator=operator)
        self.table.add(slot)  # now: the next accept may come before the relay is made
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.upstream_path)
            spliced = None if first is None else (first.handshake, first.after)
            relay = Relay(
                rid, (reader, writer), (up_reader, up_writer), self.limits, self.backlogs, spliced
            )
            if slot.conn.closed is not None:  # closed for room already
                relay.close(slot.conn.closed)
            slot.conn = relay
            flushed = await relay.run()
            why = relay.dropped
            if why is not None:
                self.dropped += 1
                log.warning("dropped %s connection %s: %s", self.name, connection_tag(rid), why)
            elif relay.closed is not None and self._reclaims.take() is not None:
                log.info(
                    "closed %s connection %s: %s (%d closed for room so far)",
                    self.name, connection_tag(rid), relay.closed, self.table.reclaimed,
                )  # fmt: skip
            if flushed:  # the upstream side ended: hand over its last bytes
                writer.close()
                with contextlib.suppress(OSError, TimeoutError):
                    await asyncio.wait_for(writer.wait_closed(), _CLOSE_FLUSH)
        except OSError as exc:
            log.warning("the gate could not reach the %s socket: %s", self.name, exc)
        finally:
            self.table.remove(rid)  # (if it was not closed for room already)
            for w in (writer, up_writer):
                if w is not None:
                    w.close()
            if relay is not None:
                self.on_close(rid, why)

    async def _probation(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str, why: str
    ) -> None:
        """No room for a client: the operator may take a reserved slot
        (`fsd.server.transport.slots`), known by its user on this machine or by its token
        in its first request."""
        if peer == self.local_operator:
            if self.table.may_reserve():
                await self._relay(reader, writer, peer, operator=True)
                return
        elif (
            not self.curve
            and self.limits.peers == zmtp.REQUEST_PEERS
            and self.operator_token is not None
            and self.probations < _MAX_PROBATIONS
        ):
            self.probations += 1
            try:
                first = await read_first(reader, writer, self._next_id(), self.limits.peers)
            finally:
                self.probations -= 1
            if first is None:
                writer.close()
                return
            token = prefix_field(first.prefix, "token")
            if same_token(token, self.operator_token) and self.table.may_reserve():
                await self._relay(reader, writer, peer, first, operator=True)
                return
            await self._refuse(reader, writer, why, prefix_req_id(first.prefix), greeted=True)
            return
        await self._refuse(reader, writer, why)

    async def _refuse(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        why: str,
        req_id: str | None = None,
        greeted: bool = False,
    ) -> None:
        """No slot: an Error frame (NULL request peers) after the handshake, then close."""
        self.refused += 1
        held = self._refusals.take()
        if held is not None:  # one line per interval, whatever the flood
            log.warning(
                "refused a %s connection: %s (%d refused so far)", self.name, why, self.refused
            )
        if self.curve or self.limits.peers != zmtp.REQUEST_PEERS:
            writer.close()
            return
        error = P.Error(
            code="too-many-connections",
            message=f"{why}: close idle clients, or ask the operator to raise max_connections",
            req_id=req_id,
        )
        await refuse(reader, writer, error, greeted=greeted)


class _Opening:
    """A slot's connection while its relay is being made."""

    ready = False

    def __init__(self) -> None:
        self.active = time.monotonic()
        self.closed: str | None = None

    def close(self, why: str) -> None:
        self.closed = why


async def _listen(endpoint: str, serve: Callable) -> list[asyncio.AbstractServer]:
    """Servers on tcp://HOST:PORT (one per address) or ipc://PATH, on guarded
    listening sockets (`fsd.server.listen`: out of descriptors, no spin, one line)."""
    what = f"the gate ({endpoint})"
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        with contextlib.suppress(FileNotFoundError):
            if Path(path).is_socket():
                os.unlink(path)  # a dead daemon's socket (the pidfile lock says none runs)
        return [await asyncio.start_unix_server(serve, sock=unix_listener(path, what))]
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or parts.port is None:
        raise ConfigError(f"the endpoint must be tcp://HOST:PORT or ipc://PATH, got {endpoint!r}")
    host = parts.hostname
    if host in (None, "*", ""):
        host = None  # every interface (only with CURVE: fsd.server.security)
    socks = tcp_listeners(host, parts.port, what)
    return [await asyncio.start_server(serve, sock=s) for s in socks]
