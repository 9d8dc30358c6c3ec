"""A request connection's frames on their way to the daemon's ROUTER, within the budget.

After the handshake (`fsd.server.transport.zmtp`) each frame is cut as it streams
(`fsd.server.transport.frames`) and its bytes are counted in the inbound ledger
(`fsd.server.transport.ledger`), per connection and in all, before it passes. A frame that does
not fit:

* under NULL is refused: its body streams to nowhere (never held whole) and a
  stand-in frame passes instead, which the Frontend answers "overloaded" (or
  "too-large" past `max_frame_bytes`, which libzmq would answer by dropping the
  connection without a word);
* under CURVE the gate cannot forge a frame (each is encrypted), so it stops reading
  that connection until the budget has room: TCP backpressure on that client alone.
  A frame past `max_frame_bytes` + slack closes the connection, as libzmq would.

Commands carry no message part. Under NULL a DEALER or REQ sends only PING and PONG
after its handshake: any other command (SUBSCRIBE, CANCEL, unknown ones, which a
ROUTER would hand the daemon as messages no budget counted) closes the connection,
as does one bigger than `MAX_COMMAND` (libzmq's own are a few hundred bytes). The
message in progress when a connection ends is given back to the ledger (`end`):
libzmq discards it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from fsd.server.audit import connection_tag
from fsd.server.log_limits import Throttle
from fsd.server.transport import frames as F
from fsd.server.transport import zmtp
from fsd.server.transport.ledger import InboundLedger, cost

log = logging.getLogger("fsd.server")

MAX_COMMAND = 64 * 1024  # a bigger frame without a message part closes the connection
_ROOM_POLL = (0.005, 0.1)  # seconds between looks at the budget while a frame waits
_REFUSALS = Throttle()  # the log's lines about refused frames
_CLOSED = Throttle()  # ... and about connections closed for their commands


@dataclass(frozen=True)
class Budget:
    """What a request connection's frames are held to (`fsd.server.transport.relay.Limits`)."""

    curve: bool
    ledger: InboundLedger | None  # None: not counted (a gate built without a budget)
    max_frame: int  # NULL: bigger frames are refused as too large
    max_curve_frame: int  # CURVE: bigger frames close the connection


class RequestFrames:
    """Passes one connection's frames upstream within the budget (module doc).

    `feed` appends what passes of a read to `out` (the caller writes it upstream in
    one write) and returns False when the connection must close; `on_message` is
    called for each message frame that starts (the connection is active)."""

    def __init__(
        self,
        rid: bytes,
        budget: Budget,
        up: asyncio.StreamWriter,
        on_message: Callable[[], None] = lambda: None,
    ) -> None:
        self.rid = rid
        self.budget = budget
        self.up = up
        self.on_message = on_message
        self.cutter = F.FrameCutter()
        self._standin: _Refused | None = None  # the frame being refused now
        self._open = 0  # ledger bytes of the message in progress (module doc)
        self._more = False  # the frame being passed is not its message's last
        self._left = 0  # body bytes of the frame being passed still to come

    async def feed(self, data: bytes, out: list[bytes]) -> bool:
        for piece in self.cutter.feed(data):
            if isinstance(piece, F.Head):
                if not await self._head(piece, out):
                    return False
            elif self._standin is not None:
                await self._refused_body(piece, out)
            else:
                out.append(piece)
                self._passed(len(piece))
        if out and self.budget.ledger is not None:
            self.budget.ledger.passing()
        return True

    def end(self) -> None:
        """The connection ended: the message in progress is libzmq's to discard."""
        ledger = self.budget.ledger
        if self._open and ledger is not None:
            ledger.abandon(None if self.budget.curve else self.rid, self._open)
        self._open = 0

    def _passed(self, body: int) -> None:
        """`body` bytes of the current frame passed; at a message's end its bytes are
        libzmq's to deliver (the ledger's `completed`)."""
        self._left -= body
        if not self._left and not self._more and self._open:
            assert self.budget.ledger is not None
            self.budget.ledger.completed(self._open)
            self._open = 0

    async def _head(self, head: F.Head, out: list[bytes]) -> bool:
        """Pass a frame's start on, or refuse the frame (NULL) or wait (CURVE); False:
        close the connection. Before waiting, `out` goes upstream."""
        budget, ledger = self.budget, self.budget.ledger
        size = F.payload_size(head, budget.curve)
        if size is None:
            if head.size > MAX_COMMAND:
                return False  # no budget counts it, and libzmq would hold it whole
            if not budget.curve and not F.is_command(head, F.HEARTBEATS):
                self._closed(head)
                return False
        else:
            self.on_message()
            if ledger is None:
                pass
            elif budget.curve:
                if size > budget.max_curve_frame:
                    return False  # libzmq would drop it (MAXMSGSIZE): no room is ever enough
                if not ledger.take(None, size):
                    self._flush_out(out)
                    await _room(lambda: ledger.take(None, size))  # TCP backpressure meanwhile
                self._open += cost(size)
            elif size > budget.max_frame or not ledger.take(self.rid, size):
                self._refuse(head, size)
                await self._refused_body(b"", out)
                return True
            else:
                self._open += cost(size)
            self._more = head.more  # (a command inside a message does not end it)
        self._left = head.size
        out.append(head.header + head.peek)
        self._passed(len(head.peek))
        return True

    def _closed(self, head: F.Head) -> None:
        if _CLOSED.take() is not None:  # one line per interval, whatever the flood
            name = F.command_name(head).decode("ascii", "replace") or "?"
            log.warning(
                "closed connection %s: it sent a %s command (a DEALER or REQ sends only "
                "PING and PONG after its handshake)",
                connection_tag(self.rid), name,
            )  # fmt: skip

    def _refuse(self, head: F.Head, size: int) -> None:
        """Count and log a refused frame; its stand-in starts (NULL)."""
        budget, ledger = self.budget, self.budget.ledger
        assert ledger is not None
        count = ledger.refusal(size)
        if _REFUSALS.take() is not None:  # one line per interval, whatever the flood
            log.warning(
                "refused a frame of %d bytes from connection %s (%s; %d refused so far)",
                size,
                connection_tag(self.rid),
                "over max_frame_bytes" if size > budget.max_frame else ledger.last_refusal,
                count,
            )
        self._standin = _Refused(head, bytearray(head.peek), min(size, F.PREFIX))
        self._standin.left = head.size - len(head.peek)

    async def _refused_body(self, piece: bytes, out: list[bytes]) -> None:
        """A refused frame's body: its prefix kept, the rest dropped; once the prefix
        is whole (or the frame ends), its stand-in goes on."""
        refused, ledger = self._standin, self.budget.ledger
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
                self._more = head.more
                self._left = len(body)
                out.append(zmtp.frame(body, more=self._more))
                self._passed(len(body))
                refused.sent, refused.prefix = True, bytearray()
        if not refused.left:
            self._standin = None

    def _flush_out(self, out: list[bytes]) -> None:
        """What passed so far goes upstream before the frames wait."""
        if out:
            self.up.write(b"".join(out))
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
