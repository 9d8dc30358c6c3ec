"""A telemetry subscriber's frames: only subscriptions that can match a topic pass.

Design: libzmq's PUB keeps every subscription in a trie, a node per byte, until the
subscriber's connection ends and beyond (200 subscriptions of 60 KB held 576 MB), so
what a subscriber sends is the daemon's memory. The telemetry has a handful of
topics and a subscription matches only messages whose topic it prefixes, so under
NULL a subscription (a ZMTP 3.0 message `\\x01topic`, `\\x00topic` to cancel, or a
3.1 SUBSCRIBE or CANCEL command) passes only when its topic is a prefix of one of
them, and at most `MAX_SUBSCRIPTIONS` per connection: dropping the others changes
nothing a subscriber receives. Whatever else a subscriber sends (it has nothing else
to say) is dropped as it streams, never held; past `MAX_DROPPED` such frames the
connection is closed. PING and PONG pass. Under CURVE the frames are encrypted: a
message may carry at most a subscription's bytes, a connection may pass
`MAX_SUBSCRIPTIONS` of them and then one per `REFILL_S` seconds, and is closed past
that. Either way a subscriber holds at most a few KB of the PUB's memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from fsd.server.audit import connection_tag
from fsd.server.log_limits import Throttle
from fsd.server.transport import frames as F
from fsd.server.transport.inbound import MAX_COMMAND

log = logging.getLogger("fsd.server")

MAX_SUBSCRIPTIONS = 16  # subscriptions and cancels a connection may pass (then REFILL_S)
REFILL_S = 10.0  # seconds per further one (CURVE)
MAX_DROPPED = 64  # frames dropped before the connection is closed
_SUB_COMMAND = 1 + len(b"SUBSCRIBE")  # a 3.1 command's name and its length byte
_CURVE_MESSAGE_MAX = 96  # a CURVE message's payload: a command's name and a topic
_CLOSED = Throttle()


def _may_subscribe(head: F.Head) -> bool:
    """A data frame (3.0) or a SUBSCRIBE or CANCEL command (3.1)."""
    return not head.command or F.is_command(head, F.SUBSCRIPTIONS)


class SubscriptionFrames:
    """Passes one subscriber's subscriptions to known `topics` (module doc); `feed`
    as `fsd.server.transport.inbound.RequestFrames.feed`."""

    def __init__(self, rid: bytes, topics: Iterable[bytes], curve: bool) -> None:
        self.rid = rid
        self.curve = curve
        self.topics = tuple(topics)
        self.longest = _SUB_COMMAND + max((len(t) for t in self.topics), default=0)
        self.cutter = F.FrameCutter()
        self.passed = 0  # subscriptions passed (and cancels)
        self.dropped = 0  # frames dropped
        self._began = time.monotonic()
        self._frame: F.Head | None = None  # the frame being read whole, to decide
        self._left = 0  # body bytes of the current frame still to come
        self._body = bytearray()  # its body so far, while it may still pass
        self._keep = False  # the frame passes (whole, or as it streams)
        self._multipart = False  # the frame continues a message (never a subscription)

    async def feed(self, data: bytes, out: list[bytes]) -> bool:
        for piece in self.cutter.feed(data):
            if isinstance(piece, F.Head):
                self._left = piece.size - len(piece.peek)
                if not self._start(piece, out):
                    return False
                continue
            self._left -= len(piece)
            if self._keep:
                out.append(piece)
            elif self._frame is not None:
                self._body += piece
                if not self._left and not self._decide(out):
                    return False
        return True

    def end(self) -> None:
        """Nothing is held for a subscriber beyond the frame being read."""

    def _start(self, head: F.Head, out: list[bytes]) -> bool:
        """A frame begins: pass it (heartbeats, CURVE messages), read it whole to
        decide (a possible subscription), or drop it; False: close."""
        self._keep, self._frame, self._body = False, None, bytearray()
        multipart = self._multipart
        if not head.command:  # (a command inside a message does not end it)
            self._multipart = head.more
        if head.command and head.size > MAX_COMMAND:
            return False
        if self.curve:
            if F.payload_size(head, True) is None:  # the handshake's commands
                self._keep = True
            elif head.size > F.CURVE_OVERHEAD + _CURVE_MESSAGE_MAX or not self._count():
                return self._close("a subscription longer than any topic, or too many")
            else:
                self._keep = True
        elif F.is_command(head, F.HEARTBEATS):
            self._keep = True
        elif multipart or head.more or head.size > self.longest or not _may_subscribe(head):
            return self._drop()
        else:
            self._frame, self._body = head, bytearray(head.peek)
            return self._decide(out) if not self._left else True
        out.append(head.header + head.peek)
        return True

    def _decide(self, out: list[bytes]) -> bool:
        """A whole frame that may be a subscription: passed if its topic can match."""
        head, body = self._frame, bytes(self._body)
        assert head is not None
        self._frame, self._body = None, bytearray()
        if head.command:
            topic = body[1 + body[0] :] if body else None
        else:
            topic = body[1:] if body[:1] in (b"\x00", b"\x01") else None
        if topic is None or not any(t.startswith(topic) for t in self.topics):
            return self._drop()
        if not self._count():
            return self._drop()
        out.append(head.header + body)
        return True

    def _count(self) -> bool:
        """Whether one more subscription may pass now (module doc)."""
        allowed = MAX_SUBSCRIPTIONS
        if self.curve:
            allowed += int((time.monotonic() - self._began) / REFILL_S)
        if self.passed >= allowed:
            return False
        self.passed += 1
        return True

    def _drop(self) -> bool:
        self.dropped += 1
        if self.dropped > MAX_DROPPED:
            return self._close(f"{self.dropped} frames that are no subscription to a topic")
        return True

    def _close(self, why: str) -> bool:
        if _CLOSED.take() is not None:
            log.warning("closed telemetry connection %s: %s", connection_tag(self.rid), why)
        return False
