"""The first bytes of a ZMTP 3.x connection: checked, and the peer's routing id replaced.

Design: libzmq's ROUTER takes the routing id a peer announces in its handshake
(the `Identity` property of READY) and makes one up for a peer that announces none;
the made-up ids come from a counter, so a peer that claims the counter's next values
makes libzmq abort the whole process (an assertion in `add_out_pipe`), and a peer
that claims a departed connection's id inherits what the daemon knew of it. The
gate (`fsd.server.transport.gate`) runs every connection through `Handshake` before libzmq
sees a byte: only ZMTP 3.x greetings with the daemon's mechanism pass, and under
NULL the READY command's `Identity` is replaced by an id the gate issued (unique
per connection, never empty, never starting with 0x00, never reused), so libzmq
never makes one up and no peer chooses its own. Under CURVE the READY travels
encrypted inside INITIATE: the greeting is checked, the rest passes as it is.

Only what libzmq would read is parsed: the 64-byte greeting and, under NULL, the
first frame after it (which must be READY). ZMTP 1.0 and 2.0 peers, which announce
their id as a first message instead, are refused.
"""

from __future__ import annotations

import struct

SIGNATURE_SIZE = 10
GREETING_SIZE = 64
MAX_READY = 64 * 1024  # bytes of READY body accepted (libzmq's own is < 300)
FLAG_MORE, FLAG_LONG, FLAG_COMMAND = 0x01, 0x02, 0x04  # a frame's flags byte
REQUEST_PEERS = frozenset({b"DEALER", b"REQ"})  # sockets that may talk to the daemon's ROUTER
TELEMETRY_PEERS = frozenset({b"SUB", b"XSUB"})  # ... and to its telemetry PUB


class HandshakeRefused(Exception):
    """The peer's first bytes are not a handshake the daemon takes (the reason)."""


def greeting(mechanism: bytes = b"NULL") -> bytes:
    """A ZMTP 3.0 server greeting (used only to refuse a connection politely)."""
    return (
        b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\x00") + b"\x00" * 32
    )


def frame(body: bytes, *, command: bool = False, more: bool = False) -> bytes:
    """One ZMTP 3.x frame (short or long form)."""
    flags = (FLAG_COMMAND if command else 0) | (FLAG_MORE if more else 0)
    if len(body) < 256:
        return bytes([flags, len(body)]) + body
    return bytes([flags | FLAG_LONG]) + struct.pack(">Q", len(body)) + body


def ready(properties: list[tuple[bytes, bytes]]) -> bytes:
    """A READY command frame carrying `properties` in order."""
    body = b"\x05READY" + b"".join(
        bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
        for name, value in properties
    )
    return frame(body, command=True)


def parse_ready(body: bytes) -> list[tuple[bytes, bytes]]:
    """The properties of a READY command's body; HandshakeRefused if it is not one."""
    if body[:6] != b"\x05READY":
        raise HandshakeRefused("the first command is not READY")
    props: list[tuple[bytes, bytes]] = []
    pos = 6
    while pos < len(body):
        size = body[pos]
        name = body[pos + 1 : pos + 1 + size]
        pos += 1 + size
        if size == 0 or len(name) != size or pos + 4 > len(body):
            raise HandshakeRefused("a READY property is cut short")
        (length,) = struct.unpack_from(">I", body, pos)
        pos += 4
        value = body[pos : pos + length]
        if len(value) != length:
            raise HandshakeRefused("a READY property's value is cut short")
        pos += length
        props.append((name, value))
    return props


class Handshake:
    """Feeds a connection's client-to-daemon bytes through the checks (module doc).

    `feed` returns the bytes that may go on to libzmq now (possibly none yet) and
    raises HandshakeRefused when the connection must be closed. After the handshake
    part it returns what it is given unchanged. `feed_split` returns the handshake's
    bytes and the frames after it apart (the gate counts those, `fsd.server.transport.frames`).
    `peers`: the socket types that may connect.
    """

    def __init__(
        self, routing_id: bytes, curve: bool, peers: frozenset[bytes] = REQUEST_PEERS
    ) -> None:
        if not routing_id or routing_id[0] == 0 or len(routing_id) > 255:
            raise ValueError("a gate-issued routing id is 1-255 bytes, not starting with 0x00")
        self.routing_id = routing_id
        self.mechanism = b"CURVE" if curve else b"NULL"
        self._buf = b""
        self._sent = 0  # greeting bytes passed on so far
        self.peers = peers
        self.done = False

    def feed(self, data: bytes) -> bytes:
        shake, rest = self.feed_split(data)
        return shake + rest

    def feed_split(self, data: bytes) -> tuple[bytes, bytes]:
        """(handshake bytes that may go on now, the bytes after the handshake)."""
        if self.done:
            return b"", data
        self._buf += data
        out = self._greeting()
        if self._sent < GREETING_SIZE:
            return out, b""
        if self.mechanism == b"CURVE":  # READY is encrypted: nothing more to check
            self.done = True
            rest, self._buf = self._buf, b""
            return out, rest
        first = self._first_frame()
        if first is None:
            return out, b""
        self.done = True
        return out + first[0], first[1]

    def _greeting(self) -> bytes:
        """The greeting bytes that passed their checks and were not passed on yet."""
        buf, start = self._buf, self._sent
        if start >= GREETING_SIZE:
            return b""
        if start == 0 and len(buf) >= 1 and buf[0] != 0xFF:
            raise HandshakeRefused("not a ZMTP 3 greeting (ZMTP 1.0 peers are refused)")
        if start < SIGNATURE_SIZE:
            if len(buf) < SIGNATURE_SIZE:
                return b""
            if not buf[9] & 0x01:
                raise HandshakeRefused("not a ZMTP 3 greeting (ZMTP 1.0 peers are refused)")
            self._sent = SIGNATURE_SIZE
        if self._sent == SIGNATURE_SIZE:  # the major version: libzmq answers it
            if len(buf) <= SIGNATURE_SIZE:
                return buf[start:SIGNATURE_SIZE]
            if buf[SIGNATURE_SIZE] < 3:
                raise HandshakeRefused(f"ZMTP {buf[SIGNATURE_SIZE]}.x peers are refused")
            self._sent = SIGNATURE_SIZE + 1
        if len(buf) < GREETING_SIZE:
            return buf[start : self._sent]
        mechanism = buf[12:32].rstrip(b"\x00")
        if mechanism != self.mechanism:
            raise HandshakeRefused(
                f"mechanism {mechanism.decode('ascii', 'replace')!r}; this daemon speaks "
                f"{self.mechanism.decode()}"
            )
        self._sent = GREETING_SIZE
        out, self._buf = buf[start:GREETING_SIZE], buf[GREETING_SIZE:]
        return out

    def _first_frame(self) -> tuple[bytes, bytes] | None:
        """The READY frame with the gate's routing id, then whatever followed it."""
        buf = self._buf
        if len(buf) < 2:
            return None
        flags = buf[0]
        if not flags & FLAG_COMMAND or flags & FLAG_MORE:
            raise HandshakeRefused("the first frame is not a command")
        if flags & FLAG_LONG:
            if len(buf) < 9:
                return None
            (size,) = struct.unpack_from(">Q", buf, 1)
            start = 9
        else:
            size, start = buf[1], 2
        if size > MAX_READY:
            raise HandshakeRefused(f"a READY of {size} bytes")
        if len(buf) < start + size:
            return None
        props = parse_ready(buf[start : start + size])
        kinds = [v for n, v in props if n == b"Socket-Type"]
        if len(kinds) != 1 or kinds[0] not in self.peers:
            served = " and ".join(sorted(k.decode() for k in self.peers))
            raise HandshakeRefused(f"socket type {kinds!r}; this endpoint serves {served}")
        kept = [(n, v) for n, v in props if n != b"Identity"]
        rest, self._buf = buf[start + size :], b""
        return ready([*kept, (b"Identity", self.routing_id)]), rest


class ServerHandshake:
    """The daemon's side of a connection until its handshake ends: the greeting, then
    its command frames up to READY (under CURVE WELCOME comes first; READY's is the
    one only a peer with an admitted key gets). `feed` returns what goes on to the
    client: everything as it comes, or with `strip` nothing of the handshake (the gate
    answered that client's handshake itself and only then handed it to libzmq).
    `done` once READY has passed. libzmq's own frames: small, read whole."""

    def __init__(self, *, strip: bool = False) -> None:
        self.strip = strip
        self.done = False
        self._buf = b""
        self._greeted = False

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return data
        self._buf += data
        while not self.done and self._next() is not None:
            pass
        if not self.strip:
            return data  # (libzmq sends its greeting in parts, each awaited by the peer)
        if not self.done:
            return b""
        rest, self._buf = self._buf, b""
        return rest

    def _next(self) -> bytes | None:
        """The next whole piece of the handshake (greeting or command), or None."""
        buf = self._buf
        if not self._greeted:
            if len(buf) < GREETING_SIZE:
                return None
            self._greeted = True
            self._buf = buf[GREETING_SIZE:]
            return buf[:GREETING_SIZE]
        if not buf:
            return None
        if not buf[0] & FLAG_COMMAND:  # no READY came: nothing more to watch
            self.done = True
            return b""
        start = 9 if buf[0] & FLAG_LONG else 2
        if len(buf) < start:
            return None
        size = struct.unpack_from(">Q", buf, 1)[0] if buf[0] & FLAG_LONG else buf[1]
        if len(buf) < start + size:
            return None
        self.done = buf[start : start + 6] == b"\x05READY"
        self._buf = buf[start + size :]
        return buf[: start + size]
