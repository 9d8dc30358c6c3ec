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

A frame that carries no message part (a command: libzmq's heartbeats, CURVE's
handshake) costs nothing, so one bigger than `MAX_COMMAND` closes the connection
(libzmq's own are a few hundred bytes). What a connection passes in one read goes
upstream in one write. The message in progress when a connection ends is given back
to the ledger: libzmq discards it.

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
from collections.abc import Callable
from dataclasses import dataclass

from fsd.server import frames as F
from fsd.server import zmtp
from fsd.server.audit import connection_tag
from fsd.server.ledger import InboundLedger, cost
from fsd.server.log_limits import Throttle
from fsd.server.zmtp import FLAG_MORE

log = logging.getLogger("fsd.server")

READ = 64 * 1024
HANDSHAKE_TIMEOUT = 10.0  # seconds a connection may take to finish its handshake
_ROOM_POLL = (0.005, 0.1)  # seconds between looks at the budget while a frame waits
MAX_COMMAND = 64 * 1024  # a bigger frame without a message part closes the connection
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
    """One gate's connections' unsent bytes; past `limit` the largest backlog is
    dropped. A dropped connection's bytes stop counting at once (it is closing)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.relays: set[Relay] = set()

    def grew(self, relay: Relay, size: int) -> None:
        if relay not in self.relays:
            return
        self.total += size
        if self.total > self.limit:
            largest = max(self.relays, key=lambda r: r.outbox.size)
            largest.drop(
                f"{largest.outbox.size} bytes of replies unsent while all connections' "
                f"{self.total} exceed max_backlog_bytes {self.limit}"
            )

    def shrank(self, relay: Relay, size: int) -> None:
        if relay in self.relays:
            self.total -= size

    def forget(self, relay: Relay) -> None:
        if relay in self.relays:
            self.relays.discard(relay)
            self.total -= relay.outbox.size


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
        self._killed = asyncio.Event()
        self._standin: _Refused | None = None  # the frame being refused now
        self._open = 0  # ledger bytes of the message in progress (module doc)
        self._more = False  # the frame being passed is not its message's last
        self._left = 0  # body bytes of the frame being passed still to come

    def drop(self, why: str) -> None:
        if self.dropped is None:
            self.dropped = why
            self.backlogs.forget(self)
            self._killed.set()

    async def run(self) -> bool:
        """Relay until either side ends or the connection is dropped; True when the
        daemon's side ended first and everything it sent was handed to the client."""
        self.backlogs.relays.add(self)
        fill = asyncio.create_task(self._fill())  # ends into the outbox, which flush empties
        tasks = {
            asyncio.create_task(self._inbound()),
            flush := asyncio.create_task(self._flush()),
            asyncio.create_task(self._killed.wait()),
        }
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in (*pending, fill):
                task.cancel()
            await asyncio.gather(*pending, fill, return_exceptions=True)
            return flush in done and self.dropped is None
        finally:
            self.backlogs.forget(self)
            ledger = self.limits.ledger
            if self._open and ledger is not None:
                ledger.abandon(None if self.limits.curve else self.rid, self._open)
                self._open = 0

    # ---- daemon to client ------------------------------------------------------------

    async def _fill(self) -> None:
        """Read libzmq's side as fast as it comes (its pipe stays short)."""
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await self.up_reader.read(READ)
                if not data:
                    break
                self.outbox.push(data)
                self.backlogs.grew(self, len(data))
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
                self.backlogs.shrank(self, len(data))
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
                out: list[bytes] = []  # what passes of this read: one write upstream
                for piece in cutter.feed(data):
                    if isinstance(piece, F.Head):
                        if not await self._head(piece, out):
                            return
                    elif self._standin is not None:
                        await self._refused_body(piece, out)
                    else:
                        out.append(piece)
                        self._passed(len(piece))
                if out:
                    up.write(b"".join(out))
                    ledger.passing()
            await up.drain()
            data = await self.reader.read(READ)
            if not data:
                return

    def _passed(self, body: int) -> None:
        """`body` bytes of the current frame passed; at a message's end its bytes are
        libzmq's to deliver (the ledger's `completed`)."""
        self._left -= body
        if not self._left and not self._more and self._open:
            assert self.limits.ledger is not None
            self.limits.ledger.completed(self._open)
            self._open = 0

    async def _head(self, head: F.Head, out: list[bytes]) -> bool:
        """Pass a frame's start on, or refuse the frame (NULL) or wait (CURVE); False:
        close the connection. Before waiting, `out` goes upstream."""
        limits, ledger = self.limits, self.limits.ledger
        assert ledger is not None
        size = F.payload_size(head, limits.curve)
        if size is None:
            if head.size > MAX_COMMAND:
                return False  # no budget counts it, and libzmq would hold it whole
        elif limits.curve:
            if size > limits.max_curve_frame:
                return False  # libzmq would drop it (MAXMSGSIZE): no room is ever enough
            if not ledger.take(None, size):
                self._flush_out(out)
                await _room(lambda: ledger.take(None, size))  # TCP backpressure meanwhile
            self._open += cost(size)
        elif size > limits.max_frame or not ledger.take(self.rid, size):
            self._refuse(head, size)
            await self._refused_body(b"", out)
            return True
        else:
            self._open += cost(size)
        if size is not None:  # a command inside a message does not end it
            self._more = bool(head.flags & FLAG_MORE)
        self._left = head.size
        out.append(head.header + head.peek)
        self._passed(len(head.peek))
        return True

    def _refuse(self, head: F.Head, size: int) -> None:
        """Count and log a refused frame; its stand-in starts (NULL)."""
        limits, ledger = self.limits, self.limits.ledger
        assert ledger is not None
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

    async def _refused_body(self, piece: bytes, out: list[bytes]) -> None:
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
                if not ledger.take(self.rid, len(body), reserve_ok=True):
                    self._flush_out(out)
                    await _room(lambda: ledger.take(self.rid, len(body), reserve_ok=True))
                self._open += cost(len(body))
                self._more = bool(head.flags & FLAG_MORE)
                self._left = len(body)
                out.append(zmtp.frame(body, more=self._more))
                self._passed(len(body))
                refused.sent, refused.prefix = True, bytearray()
        if not refused.left:
            self._standin = None

    def _flush_out(self, out: list[bytes]) -> None:
        """What passed so far goes upstream before the relay waits."""
        if out:
            self.up_writer.write(b"".join(out))
            out.clear()


async def _room(take: Callable[[], bool]) -> None:
    """Wait until `take()` finds room in the budget: looks ever less often, up to
    `_ROOM_POLL`'s longest interval (a flood of waiting connections costs little)."""
    delay, longest = _ROOM_POLL
    while not take():
        await asyncio.sleep(delay)
        delay = min(2 * delay, longest)


@dataclass
class _Refused:
    """A frame being refused: its head, the prefix kept so far, how much of one."""

    head: F.Head
    prefix: bytearray
    want: int
    left: int = 0  # body bytes still to come
    sent: bool = False  # its stand-in went on
