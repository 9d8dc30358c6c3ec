"""ZMTP frames after the handshake, cut as they stream, and the stand-in for a refused one.

The gate (`fsd.server.transport.gate`) counts the bytes of every client frame it passes to the
daemon's ROUTER and refuses those that do not fit the inbound budget
(`fsd.server.transport.ledger`), without ever holding a frame whole: `FrameCutter` turns a
connection's bytes into a `Head` per frame (its flags, its size, its header bytes
and the first few bytes of its body) followed by the body in pieces as they arrive.

What a frame costs the budget (`payload_size`): under NULL a data frame carries the
message part itself; under CURVE libzmq 4.3.5 sends each message part as a data frame
holding a MESSAGE command (`\\x07MESSAGE`, an 8-byte nonce, then the part boxed with
a 16-byte tag and a flags byte: 33 bytes more than the part), measured on the wire.
Commands (PING, PONG, the handshake's) are never delivered as messages: they cost 0.

A refused frame (NULL only: under CURVE the gate cannot forge a frame) reaches the
daemon as a stand-in (`standin`): `STANDIN_TAG` (its first byte 0xC1 never begins
msgpack), the refused frame's size and its first `PREFIX` bytes, from which the
Frontend answers "overloaded" with the request's `req_id` (`prefix_req_id`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from fsd.server.transport.zmtp import FLAG_COMMAND, FLAG_LONG, FLAG_MORE

PEEK = 8  # body bytes a Head carries: enough for a command's name
CURVE_OVERHEAD = 33  # "\x07MESSAGE" + nonce (8) + tag (16) + flags (1)
_CURVE_MESSAGE = b"\x07MESSAGE"
STANDIN_TAG = b"\xc1fsd-refused\x00"
PREFIX = 4096  # bytes of a refused frame its stand-in carries


@dataclass(frozen=True)
class Head:
    """A frame's start: `header` (flags and size bytes) and `peek`, its body's first
    min(size, PEEK) bytes; the rest of the body follows as plain bytes."""

    flags: int
    size: int
    header: bytes
    peek: bytes

    @property
    def command(self) -> bool:
        return bool(self.flags & FLAG_COMMAND)

    @property
    def more(self) -> bool:
        return bool(self.flags & FLAG_MORE)


HEARTBEATS = (b"PING", b"PONG")
SUBSCRIPTIONS = (b"SUBSCRIBE", b"CANCEL")


def command_name(head: Head) -> bytes:
    """A command frame's name as far as its head shows it (at most PEEK - 1 bytes:
    b"SUBSCRI" for SUBSCRIBE); b"" for a data frame or an empty command."""
    if not head.command or not head.peek:
        return b""
    return head.peek[1 : 1 + head.peek[0]]


def is_command(head: Head, names: tuple[bytes, ...]) -> bool:
    """Whether `head` is a command frame named one of `names`."""
    name = command_name(head)
    return bool(name) and any(n.startswith(name) and head.peek[0] == len(n) for n in names)


class FrameCutter:
    """Cuts a ZMTP 3.x stream (after the handshake) into `Head`s and body pieces.

    It holds at most a header and `PEEK` bytes, whatever the frames' sizes."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.left = 0  # body bytes of the current frame still to come

    def feed(self, data: bytes) -> list[Head | bytes]:
        out: list[Head | bytes] = []
        view, pos, n = memoryview(data), 0, len(data)
        while pos < n:
            if self.left:
                take = min(self.left, n - pos)
                out.append(data if take == n else bytes(view[pos : pos + take]))
                pos += take
                self.left -= take
                continue
            need = self._need()
            take = min(need - len(self._buf), n - pos)
            self._buf += view[pos : pos + take]
            pos += take
            if len(self._buf) == need and need == self._need():  # header and peek complete
                out.append(self._head())
        return out

    def _need(self) -> int:
        """Bytes of header and peek the current frame needs (more once its size is known)."""
        buf = self._buf
        if not buf:
            return 2
        header = 9 if buf[0] & FLAG_LONG else 2
        if len(buf) < header:
            return header
        return header + min(_size(buf), PEEK)

    def _head(self) -> Head:
        buf = self._buf
        header = 9 if buf[0] & FLAG_LONG else 2
        size = _size(buf)
        head = Head(buf[0], size, bytes(buf[:header]), bytes(buf[header:]))
        self.left = size - len(head.peek)
        self._buf = bytearray()
        return head


def _size(buf: bytearray) -> int:
    return struct.unpack_from(">Q", buf, 1)[0] if buf[0] & FLAG_LONG else buf[1]


def payload_size(head: Head, curve: bool) -> int | None:
    """The message part's bytes a frame carries to the daemon; None: none (a command)."""
    if curve:  # every part is a MESSAGE (a data frame from libzmq 4.3.5; a command per RFC 26)
        if not head.peek.startswith(_CURVE_MESSAGE[: len(head.peek)]) or head.size < 8:
            return None
        return max(0, head.size - CURVE_OVERHEAD)
    return None if head.command else head.size


def standin(size: int, prefix: bytes) -> bytes:
    """The body that replaces a refused frame of `size` bytes beginning with `prefix`."""
    return STANDIN_TAG + struct.pack(">Q", size) + prefix[:PREFIX]


def parse_standin(payload: bytes) -> tuple[int, bytes] | None:
    """(size, prefix) of a stand-in; None for any other payload."""
    start = len(STANDIN_TAG) + 8
    if not payload.startswith(STANDIN_TAG) or len(payload) < start:
        return None
    return struct.unpack_from(">Q", payload, len(STANDIN_TAG))[0], payload[start:]
