"""The bytes HTTP connections sent that no request handler has taken yet, bounded.

A request body is read within its byte budget (`fsd.server.http.limits`), but a head
is aiohttp's to hold while it arrives (up to 128 headers of 8 KB each): per connection
aiohttp bounds it, over thousands of connections nothing would. So the bytes of each
head are counted as they arrive, until its blank line (the body that follows is
bounded by aiohttp's flow control and then the body budget, until the request is
answered with its body read, when a new head may come: aiohttp discards an unread
body's rest and closes the connection): one connection's unfinished head holds at most
`per_connection`, all of them `total` (a quarter of `http_max_inflight_bytes`:
aiohttp's parsing holds about twice what it read). Past the first the
connection is closed; past the second, the one holding the most. One throttled log
line says so.

`CountedSite` serves a listening socket as aiohttp's `SockSite` does, each of its
connection handlers wrapped (`HeadBytes.protocol`: a plain asyncio protocol, every
call passed on) so that the count sees each read first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from fsd.server.log_limits import Throttle

log = logging.getLogger("fsd.http")

Transport = asyncio.BaseTransport
HEAD_BYTES = 1 << 20  # one connection's bytes before a request of it starts


class HeadBytes:
    """The count (module doc); `busy(transport)`: a request of it is being handled."""

    def __init__(self, per_connection: int, total: int, busy: Callable[[Transport], bool]) -> None:
        self.per_connection = per_connection
        self.total = total
        self.busy = busy
        self.held: dict[Transport, int] = {}  # head bytes of connections reading one
        self.sum = 0
        self.closed = 0  # connections closed for what they held
        self._tail: dict[Transport, bytes] = {}  # a head's last bytes (its end may straddle)
        self._bodies: set[Transport] = set()  # connections whose head came whole
        self._throttles = {True: Throttle(), False: Throttle()}  # one connection's, all

    def received(self, transport: Transport, data: bytes) -> bool:
        """Count a read from `transport`; False: it was closed for it."""
        if transport in self._bodies or self.busy(transport):
            return True  # a body: aiohttp's flow control and the body's budget bound it
        tail = self._tail.get(transport, b"")
        end = (tail + data).find(b"\r\n\r\n")
        if end >= 0:  # the head is whole: aiohttp parses it and takes it
            self._bodies.add(transport)
            self.forget(transport)
            return True
        self._tail[transport] = data[-3:]
        held = self.held.get(transport, 0) + len(data)
        self.held[transport] = held
        self.sum += len(data)
        if held > self.per_connection:
            why = f"a request head of {held} bytes and not whole (at most {self.per_connection})"
            self._close(True, transport, why)
            return False
        if self.sum > self.total:
            largest = max(self.held, key=self.held.__getitem__)
            why = (
                f"all connections hold {self.sum} bytes of unfinished heads (at most {self.total})"
            )
            self._close(False, largest, why)
            return largest is not transport
        return True

    def ended(self, transport: Transport, whole: bool) -> None:
        """A request of `transport` was answered: what it sends next is a head once its
        body was read `whole` (else aiohttp discards the rest, then closes it)."""
        if whole:
            self._bodies.discard(transport)

    def forget(self, transport: Transport) -> None:
        self.sum -= self.held.pop(transport, 0)
        self._tail.pop(transport, None)

    def gone(self, transport: Transport) -> None:
        self.forget(transport)
        self._bodies.discard(transport)

    def _close(self, own: bool, transport: Transport, why: str) -> None:
        self.gone(transport)
        self.closed += 1
        transport.abort()
        held = self._throttles[own].take()
        if held is not None:
            peer = transport.get_extra_info("peername")
            log.warning(
                "closed HTTP connection from %s: %s (%d closed so far)", peer, why, self.closed
            )

    def protocol(self, inner: asyncio.Protocol) -> asyncio.Protocol:
        """`inner` (aiohttp's handler of one connection), each read counted first."""
        return _Counted(inner, self)


class _Counted(asyncio.Protocol):
    """Passes every protocol call on to `inner`; reads only once counted."""

    def __init__(self, inner: Any, heads: HeadBytes) -> None:
        self.inner = inner
        self.heads = heads
        self.transport: Transport | None = None

    def connection_made(self, transport: Transport) -> None:
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if self.heads.received(self.transport, data):
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.heads.gone(self.transport)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class CountedSite(web.SockSite):
    """aiohttp's `SockSite`, its connections' reads counted by `heads`."""

    def __init__(self, runner: web.BaseRunner, sock: Any, heads: HeadBytes) -> None:
        super().__init__(runner, sock)
        self.heads = heads

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: self.heads.protocol(server()), sock=self._sock, backlog=self._backlog
        )
