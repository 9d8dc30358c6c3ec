"""A connection the table has no room for: its first request read by the gate, then
let into the operator's reserve or refused with a one-line `Error`.

Design: the operator's token travels in a request, inside the ZMTP stream, after the
handshake; libzmq must not see a connection that may yet be refused. So under NULL
the gate answers the handshake itself (greeting and READY, as libzmq's ROUTER would)
and reads the first message frame's first bytes (`read_first`). An operator's
connection then goes to libzmq whole: what the gate read is sent upstream first and
libzmq's own greeting and READY are kept from the client (`fsd.server.transport.relay.Relay`'s
`spliced`). Anyone else gets `Error` "too-many-connections" naming its `req_id`, then
the connection closes (`refuse`). Under CURVE nothing can be read: refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from fsd import protocol as P
from fsd.server.transport import frames as F
from fsd.server.transport import zmtp

PROBATION_WAIT = 2.0  # seconds a connection on probation has to send its first request
REFUSE_WAIT = 2.0  # seconds a refused connection may take to read its Error
MAX_BEFORE_FIRST = 64 * 1024  # bytes read before the first request's prefix: past it, refused
_READ = 64 * 1024
_PREFIX = 4096  # bytes of the first request read for its token


@dataclass(frozen=True)
class FirstRequest:
    """What the gate read of a connection on probation."""

    rid: bytes  # the routing id the gate issued it
    handshake: bytes  # the client's checked handshake (its routing id replaced), for libzmq
    after: bytes  # the bytes that followed it, as read
    prefix: bytes  # the first message frame's first bytes (its token, its req_id)


async def read_first(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rid: bytes, peers: frozenset[bytes]
) -> FirstRequest | None:
    """Answer a NULL handshake as the ROUTER would and read the first request's first
    bytes; None if the peer's handshake is refused or it sends no request in time."""
    shake = zmtp.Handshake(rid, curve=False, peers=peers)
    writer.write(zmtp.greeting())
    handshake, after = b"", b""
    try:
        async with asyncio.timeout(PROBATION_WAIT):
            while not shake.done:
                data = await reader.read(_READ)
                if not data:
                    return None
                passed, after = shake.feed_split(data)
                handshake += passed
            writer.write(zmtp.ready([(b"Socket-Type", b"ROUTER")]))
            while (prefix := _first_prefix(after)) is None:
                if len(after) > MAX_BEFORE_FIRST:
                    return None
                data = await reader.read(_READ)
                if not data:
                    return None
                after += data
    except (TimeoutError, OSError, zmtp.HandshakeRefused):
        return None
    return FirstRequest(rid, handshake, after, prefix)


def _first_prefix(stream: bytes) -> bytes | None:
    """The first message frame's first bytes in `stream` once they are there (commands
    before it skipped), else None."""
    body = bytearray()
    head: F.Head | None = None
    for piece in F.FrameCutter().feed(stream):
        if isinstance(piece, F.Head):
            if head is not None:
                break  # that frame ended
            if not piece.command and (piece.size or not piece.more):  # (REQ's empty first part)
                head, body = piece, bytearray(piece.peek)
        elif head is not None:
            body += piece
    if head is None:
        return None
    want = min(head.size, _PREFIX)
    return bytes(body[:want]) if len(body) >= want else None


async def refuse(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    error: P.Error,
    *,
    greeted: bool,
) -> None:
    """Send `error` once the peer's handshake allows it (NULL request peers), then
    close; `greeted`: the gate already answered the handshake (probation)."""
    try:
        if not greeted:
            # the Error may only follow the peer's READY (libzmq drops a peer whose
            # message arrives inside the handshake)
            writer.write(zmtp.greeting())
            await asyncio.wait_for(_read_handshake(reader), REFUSE_WAIT)
            writer.write(zmtp.ready([(b"Socket-Type", b"ROUTER")]))
        writer.write(zmtp.frame(P.encode(error)))
        writer.write_eof()
        # read until the peer closes: closing on unread bytes resets the connection,
        # which could discard the Error before the peer reads it
        await asyncio.wait_for(_discard(reader), REFUSE_WAIT)
    except (OSError, TimeoutError, zmtp.HandshakeRefused):
        pass
    finally:
        writer.close()


async def _read_handshake(reader: asyncio.StreamReader) -> None:
    """Consume a NULL peer's greeting and READY."""
    shake = zmtp.Handshake(b"x", curve=False)
    while not shake.done:
        data = await reader.read(_READ)
        if not data:
            return
        shake.feed(data)


async def _discard(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(OSError):
        while await reader.read(_READ):
            pass
