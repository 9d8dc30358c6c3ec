"""The gate: a daemon's public endpoint, in front of its ROUTER (or telemetry PUB) socket.

Design: libzmq lets a peer choose its routing id, and a ROUTER that meets a chosen
id equal to one it generated aborts the process (`fsd.server.zmtp`). So libzmq never
listens where peers can reach it: the ROUTER binds an `ipc://` path inside a folder
only the daemon's user may enter, and this gate listens on the public endpoint
(tcp:// or ipc://), relays each connection's bytes to that path, and on the way
replaces the routing id in the handshake with one it issues (`c` + a 64-bit
counter: unique per connection, never reused). A routing id therefore names one
connection and nothing else; who a caller is comes from its session or CURVE key
(`fsd.server.clients`).

It also holds the connection cap: past `max_connections` a new connection gets
an `Error` "too-many-connections" (under NULL; under CURVE it is closed) and is
closed, and the file-descriptor limit is raised to what the kernel allows at start;
out of descriptors even so, its listener refuses without spinning (`fsd.server.listen`).
Each connection is relayed by a `fsd.server.relay.Relay` on the gate's own thread,
within byte budgets: client frames are counted in the inbound ledger and refused
(NULL: a stand-in answered "overloaded") or held back (CURVE: TCP backpressure) when
it is full; the upstream socket is read as fast as it writes into a per-connection
outbox, and a connection whose unsent bytes pass its budget (or the largest, when
all connections' pass `max_backlog`) is dropped. Under NULL the ROUTER's route for
a connection is the gate's routing id; under CURVE the handshake passes encrypted,
so the gate does not know which route is whose (only bytes are counted, which holds
alike). Closed connections are reported through `on_close(routing_id, why)` on the
gate's thread, `why` saying why the gate dropped it (None: it closed). The same gate
fronts the telemetry PUB (`fsd.server.gates`), admitting SUB and XSUB peers.
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
from fsd.errors import ConfigError
from fsd.server import zmtp
from fsd.server.audit import connection_tag
from fsd.server.listen import raise_fd_limit, tcp_listeners, unix_listener
from fsd.server.loop_thread import LoopThread
from fsd.server.relay import READ, Backlogs, Limits, Relay

log = logging.getLogger("fsd.server")

_FDS_PER_CONNECTION = 3  # the client's socket, the relay's ipc socket, libzmq's side of it
_FD_RESERVE = 256  # descriptors kept for the model, logs, HTTP and telemetry
_START_TIMEOUT = 10.0
_REFUSE_WAIT = 2.0  # seconds a refused connection may take to read its Error
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


class Gate(LoopThread):
    """Relays the public endpoint to the upstream socket's private `ipc://` path
    (module doc); `limits`: its connections' peers and budgets (`fsd.server.relay`)."""

    def __init__(
        self,
        endpoint: str,
        *,
        limits: Limits,
        max_connections: int,
        max_backlog: int = 1 << 30,
        on_close: Callable[[bytes, str | None], None] = lambda rid, why: None,
        name: str = "requests",
    ) -> None:
        super().__init__(f"fsd-gate-{name}")
        self.endpoint = endpoint
        self.limits = limits
        self.curve = limits.curve
        self.name = name
        self.max_connections = connection_cap(max_connections, raise_fd_limit()[1])
        self.on_close = on_close
        self._dir = Path(tempfile.mkdtemp(prefix="fsd-gate-"))  # 0700, ours
        self.upstream_path = str(self._dir / "up")
        self.upstream = f"ipc://{self.upstream_path}"
        self.live = 0
        self.refused = 0
        self.dropped = 0  # connections dropped for their backlog
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

    def figures(self) -> dict[str, float]:
        """Its counters, for /metrics (read from another thread: plain ints)."""
        return {"dropped": float(self.dropped), "backlog": float(self.backlogs.total)}

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
            await self._relay(reader, writer)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.live >= self.max_connections:
            await self._refuse(reader, writer)
            return
        self.live += 1
        rid = self._next_id()
        up_writer: asyncio.StreamWriter | None = None
        why: str | None = None
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.upstream_path)
            relay = Relay(rid, (reader, writer), (up_reader, up_writer), self.limits, self.backlogs)
            flushed = await relay.run()
            why = relay.dropped
            if why is not None:
                self.dropped += 1
                log.warning("dropped %s connection %s: %s", self.name, connection_tag(rid), why)
            if flushed:  # the upstream side ended: hand over its last bytes
                writer.close()
                with contextlib.suppress(OSError, TimeoutError):
                    await asyncio.wait_for(writer.wait_closed(), _CLOSE_FLUSH)
        except OSError as exc:
            log.warning("the gate could not reach the %s socket: %s", self.name, exc)
        finally:
            self.live -= 1
            for w in (writer, up_writer):
                if w is not None:
                    w.close()
            self.on_close(rid, why)

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Past the cap: an Error frame (NULL) after the handshake, then close."""
        self.refused += 1
        if self.refused in (1, 10, 100, 1000) or self.refused % 10000 == 0:
            log.warning(
                "refused a connection: %d open, max_connections is %d (%d refused so far)",
                self.live,
                self.max_connections,
                self.refused,
            )
        try:
            if not self.curve and self.limits.peers == zmtp.REQUEST_PEERS:
                error = P.Error(
                    code="too-many-connections",
                    message=f"the daemon holds {self.live} connections; max_connections is "
                    f"{self.max_connections}: close idle clients or raise max_connections",
                )
                # the Error may only follow the peer's READY (libzmq drops a peer whose
                # message arrives inside the handshake)
                writer.write(zmtp.greeting())
                await asyncio.wait_for(_read_handshake(reader), _REFUSE_WAIT)
                writer.write(
                    zmtp.ready([(b"Socket-Type", b"ROUTER")]) + zmtp.frame(P.encode(error))
                )
                writer.write_eof()
                # read until the peer closes: closing on unread bytes resets the
                # connection, which could discard the Error before the peer reads it
                await asyncio.wait_for(_discard(reader), _REFUSE_WAIT)
        except (OSError, TimeoutError, zmtp.HandshakeRefused):
            pass
        finally:
            writer.close()


async def _read_handshake(reader: asyncio.StreamReader) -> None:
    """Consume a NULL peer's greeting and READY."""
    shake = zmtp.Handshake(b"x", curve=False)
    while not shake.done:
        data = await reader.read(READ)
        if not data:
            return
        shake.feed(data)


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(READ):
        pass


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
