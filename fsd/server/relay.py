"""One gate connection: the client's bytes to libzmq within the inbound budget, and
libzmq's bytes to the client through a bounded outbound buffer.

Inbound (client to daemon), after the handshake (`fsd.server.zmtp`): each frame is
cut as it streams (`fsd.server.frames`) and its bytes are counted in the inbound
ledger (`fsd.server.ledger`) before it passes. A frame that does not fit:

* under NULL is refused: its body streams to nowhere (never held whole) and a
  stand-in frame passes instead, which the Frontend answers "overloaded" (or
  "too-large" past `max_frame_bytes`, which libzmq would answer by dropping the
  connection without a word);
* under CURVE the gate cannot forge a frame (each is encrypted), so it stops reading
  that connection until the budget has room: TCP backpressure on that client alone.
  A frame past `max_frame_bytes` + slack closes the connection, as libzmq would.

Outbound (daemon to client): libzmq's side is read as fast as it comes, so its pipe
stays short, into this connection's `Outbox`, which a second task writes to the
client as it reads. Unsent bytes past `backlog` drop the connection (both sides
closed), and all connections' together past the gate's total drop the largest
(`Backlogs`). This counts bytes only, so it holds alike under NULL and CURVE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass

from fsd.server import frames as F
from fsd.server import zmtp
from fsd.server.audit import connection_tag
from fsd.server.ledger import InboundLedger
from fsd.server.log_limits import Throttle

log = logging.getLogger("fsd.server")

READ = 64 * 1024
HANDSHAKE_TIMEOUT = 10.0  # seconds a connection may take to finish its handshake
_ROOM_POLL = 0.005  # seconds between looks at the budget while a CURVE frame waits
_REFUSALS = Throttle()  # the log's lines about refused frames


@dataclass(frozen=True)
class Limits:
    """What one gate's connections may do (module doc)."""

    curve: bool
    peers: frozenset[bytes]
    backlog: int  # a connection's unsent bytes past which it is dropped
    ledger: InboundLedger | None = None  # None: inbound not budgeted (telemetry)
    max_frame: int = 1 << 62  # NULL: bigger frames are refused as too large
    max_curve_frame: int = 1 << 62  # CURVE: bigger frames close the connection


class Outbox:
    """Bytes from libzmq not yet written to the client."""

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.eof = False
        self._ready = asyncio.Event()

    def push(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        self._ready.set()

    def close(self) -> None:
        self.eof = True
        self._ready.set()

    async def pop(self) -> bytes | None:
        """The next chunk (still counted in `size` until `sent`); None at the end."""
        while not self.chunks:
            if self.eof:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self.chunks.popleft()


class Backlogs:
    """All connections' unsent bytes; past `limit` the largest backlog is dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.relays: set[Relay] = set()

    def grew(self, size: int) -> None:
        self.total += size
        if self.total > self.limit and self.relays:
            largest = max(self.relays, key=lambda r: r.outbox.size)
            largest.drop(
                f"{largest.outbox.size} bytes of replies unsent while all connections' "
                f"{self.total} exceed max_backlog_bytes {self.limit}"
            )

    def shrank(self, size: int) -> None:
        self.total -= size


class Relay:
    """Relays one client connection to the upstream socket's path (module doc)."""

    def __init__(
        self,
        rid: bytes,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        limits: Limits,
        backlogs: Backlogs,
    ) -> None:
        self.rid = rid
        self.reader, self.writer = client
        self.up_reader, self.up_writer = upstream
        self.limits = limits
        self.backlogs = backlogs
        self.outbox = Outbox()
        self.dropped: str | None = None  # why the gate dropped it
        self.refused = 0  # frames refused (NULL) on this connection
        self._killed = asyncio.Event()
        self._standin: _Refused | None = None  # the frame being refused now

    def drop(self, why: str) -> None:
        if self.dropped is None:
            self.dropped = why
            self._killed.set()

    async def run(self) -> bool:
        """Relay until either side ends or the connection is dropped; True when the
        daemon's side ended first and everything it sent was handed to the client."""
        self.backlogs.relays.add(self)
        tasks = {
            asyncio.create_task(self._inbound()),
            asyncio.create_task(self._fill()),
            flush := asyncio.create_task(self._flush()),
            asyncio.create_task(self._killed.wait()),
        }
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return flush in done and self.dropped is None
        finally:
            self.backlogs.relays.discard(self)
            self.backlogs.shrank(self.outbox.size)
            self.outbox.size = 0

    # ---- daemon to client ------------------------------------------------------------

    async def _fill(self) -> None:
        """Read libzmq's side as fast as it comes (its pipe stays short)."""
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await self.up_reader.read(READ)
                if not data:
                    break
                self.outbox.push(data)
                self.backlogs.grew(len(data))
                if self.outbox.size > self.limits.backlog:
                    self.drop(
                        f"{self.outbox.size} bytes of replies unsent (the client does not "
                        f"read them): max backlog {self.limits.backlog}"
                    )
                    return
        self.outbox.close()

    async def _flush(self) -> None:
        """Write the outbox to the client as it reads; ends once libzmq's side ended."""
        with contextlib.suppress(OSError, ConnectionError):
            while (data := await self.outbox.pop()) is not None:
                self.writer.write(data)
                await self.writer.drain()
                self.outbox.size -= len(data)
                self.backlogs.shrank(len(data))
        if not self.outbox.chunks:
            return
        await asyncio.Event().wait()  # the client went away: the other tasks end it

    # ---- client to daemon ------------------------------------------------------------

    async def _inbound(self) -> None:
        """Client to libzmq: through the handshake checks, then frame by frame."""
        limits = self.limits
        shake = zmtp.Handshake(self.rid, limits.curve, limits.peers)
        rest = b""
        try:
            while not shake.done:
                data = await asyncio.wait_for(self.reader.read(READ), HANDSHAKE_TIMEOUT)
                if not data:
                    return
                out, rest = shake.feed_split(data)
                if out:
                    self.up_writer.write(out)
                    await self.up_writer.drain()
        except zmtp.HandshakeRefused as exc:
            log.debug("refused a connection: %s", exc)
            return
        except (TimeoutError, OSError):
            return
        with contextlib.suppress(OSError, ConnectionError):
            await self._frames(rest)

    async def _frames(self, first: bytes) -> None:
        cutter, up, ledger = F.FrameCutter(), self.up_writer, self.limits.ledger
        data = first
        while True:
            if ledger is None:
                up.write(data)
            else:
                for piece in cutter.feed(data):
                    if isinstance(piece, F.Head):
                        if not await self._head(piece):
                            return
                    elif self._standin is not None:
                        await self._refused_body(piece)
                    else:
                        up.write(piece)
                        ledger.passing()
            await up.drain()
            data = await self.reader.read(READ)
            if not data:
                return

    async def _head(self, head: F.Head) -> bool:
        """Pass a frame's start on, or refuse the frame (NULL) or wait (CURVE); False:
        close the connection."""
        limits, ledger = self.limits, self.limits.ledger
        assert ledger is not None
        size = F.payload_size(head, limits.curve)
        if size is not None and limits.curve:
            if size > limits.max_curve_frame:
                return False  # libzmq would drop it (MAXMSGSIZE): no room is ever enough
            while not ledger.take(None, size):
                await asyncio.sleep(_ROOM_POLL)  # not reading: TCP backpressure
        elif size is not None and (size > limits.max_frame or not ledger.take(self.rid, size)):
            self.refused += 1
            count = ledger.refusal(size)
            if _REFUSALS.take() is not None:  # one line per interval, whatever the flood
                log.warning(
                    "refused a frame of %d bytes from connection %s (%s; %d refused so far)",
                    size,
                    connection_tag(self.rid),
                    "over max_frame_bytes" if size > limits.max_frame else "inbound budget full",
                    count,
                )
            self._standin = _Refused(head, bytearray(head.peek), min(size, F.PREFIX))
            self._standin.left = head.size - len(head.peek)
            await self._refused_body(b"")
            return True
        self.up_writer.write(head.header + head.peek)
        return True

    async def _refused_body(self, piece: bytes) -> None:
        """A refused frame's body: its prefix kept, the rest dropped; once the prefix
        is whole (or the frame ends), its stand-in goes on."""
        refused, ledger = self._standin, self.limits.ledger
        assert refused is not None and ledger is not None
        refused.left -= len(piece)
        if not refused.sent:
            refused.prefix += piece[: refused.want - len(refused.prefix)]
            if len(refused.prefix) >= refused.want or not refused.left:
                head = refused.head
                body = F.standin(head.size, bytes(refused.prefix))
                while not ledger.take(self.rid, len(body), reserve_ok=True):
                    await asyncio.sleep(_ROOM_POLL)
                self.up_writer.write(F.encode_frame(body, head.flags & F.FLAG_MORE))
                refused.sent, refused.prefix = True, bytearray()
        if not refused.left:
            self._standin = None


@dataclass
class _Refused:
    """A frame being refused: its head, the prefix kept so far, how much of one."""

    head: F.Head
    prefix: bytearray
    want: int
    left: int = 0  # body bytes still to come
    sent: bool = False  # its stand-in went on
