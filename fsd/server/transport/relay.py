"""One gate connection: the client's bytes to libzmq, libzmq's to the client, each bounded.

Inbound (client to daemon): the handshake is checked and its routing id replaced
(`fsd.server.transport.zmtp`) within `HANDSHAKE_TIMEOUT` of the connection's start, under CURVE
as under NULL (there the handshake ends when the daemon's READY passes: a peer
without an admitted key never sees one). Then a request connection's frames pass
within the inbound budget (`fsd.server.transport.inbound`) and a subscriber's only as
subscriptions to the telemetry's topics (`fsd.server.transport.subscriptions`). What a
connection passes in one read goes upstream in one write.

Outbound (daemon to client): libzmq's side is read as fast as it comes, so its pipe
stays short, into this connection's `Outbox`, which a second task writes to the
client as it reads. Unsent bytes past `backlog` drop the connection (both sides
closed), and all connections' together past the gate's total drop the largest
(`Backlogs`). This counts bytes only, so it holds alike under NULL and CURVE.

`active` is when the connection last did something (a message frame in, bytes out):
the connection table (`fsd.server.transport.slots`) closes the longest idle ones for room.
A connection ends `dropped` (its replies piled up: its session's jobs are aborted)
or `closed` (for room or its handshake deadline: its session may resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass

from fsd.server.transport import zmtp
from fsd.server.transport.inbound import Budget, RequestFrames
from fsd.server.transport.ledger import InboundLedger
from fsd.server.transport.subscriptions import SubscriptionFrames

log = logging.getLogger("fsd.server")

READ = 64 * 1024
HANDSHAKE_TIMEOUT = 10.0  # seconds a connection may take to finish its handshake


@dataclass(frozen=True)
class Limits:
    """What one gate's connections may do (module doc)."""

    curve: bool
    peers: frozenset[bytes]
    backlog: int  # a connection's unsent bytes past which it is dropped
    ledger: InboundLedger | None = None  # None: inbound not budgeted
    max_frame: int = 1 << 62  # NULL: bigger frames are refused as too large
    max_curve_frame: int = 1 << 62  # CURVE: bigger frames close the connection
    topics: frozenset[bytes] | None = None  # a telemetry gate's: subscriptions pass only to these


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
    """Relays one client connection to the upstream socket's path (module doc).

    `spliced`: the gate answered the client's handshake itself (`fsd.server.transport.gate`'s
    probation): its checked handshake goes upstream first, then the bytes that
    followed it as frames; libzmq's own handshake is kept from the client."""

    def __init__(
        self,
        rid: bytes,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        limits: Limits,
        backlogs: Backlogs,
        spliced: tuple[bytes, bytes] | None = None,
    ) -> None:
        self.rid = rid
        self.reader, self.writer = client
        self.up_reader, self.up_writer = upstream
        self.limits = limits
        self.backlogs = backlogs
        self.outbox = Outbox()
        self.dropped: str | None = None  # why the gate dropped it
        self.closed: str | None = None  # why the gate closed it
        self.opened = self.active = time.monotonic()
        self.ready = False  # its handshake ended
        self._spliced = spliced
        self._server = zmtp.ServerHandshake(strip=spliced is not None)
        self._killed = asyncio.Event()
        self._greeted = asyncio.Event()  # the daemon's side finished its handshake
        self._frames: RequestFrames | SubscriptionFrames | None = None

    def drop(self, why: str) -> None:
        """End it for its unread replies (its session's jobs go with it)."""
        if self.dropped is None and self.closed is None:
            self.dropped = why
            self.backlogs.forget(self)
            self._killed.set()

    def close(self, why: str) -> None:
        """End it for room or its deadline (its session may resume elsewhere)."""
        if self.dropped is None and self.closed is None:
            self.closed = why
            self._killed.set()

    def touch(self) -> None:
        self.active = time.monotonic()

    async def run(self) -> bool:
        """Relay until either side ends or the connection is dropped; True when the
        daemon's side ended first and everything it sent was handed to the client."""
        self.backlogs.relays.add(self)
        fill = asyncio.create_task(self._fill())  # ends into the outbox, which flush empties
        tasks = {
            asyncio.create_task(self._inbound()),
            flush := asyncio.create_task(self._flush()),
            asyncio.create_task(self._killed.wait()),
            asyncio.create_task(self._deadline()),
        }
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in (*pending, fill):
                task.cancel()
            await asyncio.gather(*pending, fill, return_exceptions=True)
            return flush in done and self.dropped is None and self.closed is None
        finally:
            self.backlogs.forget(self)
            if self._frames is not None:
                self._frames.end()

    async def _deadline(self) -> None:
        """Ends the relay if the handshake has not ended by its deadline."""
        await asyncio.sleep(HANDSHAKE_TIMEOUT - (time.monotonic() - self.opened))
        if not self.ready:
            self.close(f"no handshake within {HANDSHAKE_TIMEOUT:g} s")
            return
        await asyncio.Event().wait()

    # ---- daemon to client ------------------------------------------------------------

    async def _fill(self) -> None:
        """Read libzmq's side as fast as it comes (its pipe stays short)."""
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await self.up_reader.read(READ)
                if not data:
                    break
                self.active = time.monotonic()
                if not self.ready:
                    data = self._server.feed(data)
                    self.ready = self._server.done
                    if self.ready:
                        self._greeted.set()
                    if not data:
                        continue
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
        rest = b""
        if self._spliced is not None:
            (shake_bytes, rest), self._spliced = self._spliced, None
            self.up_writer.write(shake_bytes)
            # libzmq closes a peer whose message comes before its own READY went out
            await self._greeted.wait()
        else:
            shake = zmtp.Handshake(self.rid, limits.curve, limits.peers)
            try:
                while not shake.done:
                    data = await self.reader.read(READ)
                    if not data:
                        return
                    out, rest = shake.feed_split(data)
                    if out:
                        self.up_writer.write(out)
                        await self.up_writer.drain()
            except zmtp.HandshakeRefused as exc:
                log.debug("refused a connection: %s", exc)
                return
            except OSError:
                return
        with contextlib.suppress(OSError, ConnectionError):
            await self._relay_frames(rest)

    async def _relay_frames(self, first: bytes) -> None:
        limits, up = self.limits, self.up_writer
        if limits.topics is not None:
            frames: RequestFrames | SubscriptionFrames = SubscriptionFrames(
                self.rid, limits.topics, limits.curve
            )
        else:
            budget = Budget(limits.curve, limits.ledger, limits.max_frame, limits.max_curve_frame)
            frames = RequestFrames(self.rid, budget, up, self.touch)
        self._frames = frames
        data = first
        while True:
            out: list[bytes] = []  # what passes of this read: one write upstream
            going = await frames.feed(data, out)
            if out:
                up.write(b"".join(out))
            if not going:
                return
            await up.drain()
            data = await self.reader.read(READ)
            if not data:
                return
