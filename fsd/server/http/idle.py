"""Which HTTP connections may be closed to make room when descriptors run out.

Out of file descriptors, refusing every new connection hands the table to whoever
filled it: 1100 idle connections under a hard limit of 1024 kept new HTTP clients out
(16 of 49 honest requests refused) until the head deadline closed them. An idle
connection (no request being handled: waiting for a head, or kept alive between
requests) loses nothing when closed, since its client just reconnects, so the HTTP
listener closes the oldest idle ones to take new ones (`fsd.server.listen`): a flood of
idle connections churns among itself and a client that speaks gets in. A connection
with a request being read or answered is never closed this way, nor one seen idle for
less than IDLE_GRACE (just made, its head may be on the way: asyncio makes its
protocol a few passes after the accept, and the head is parsed after that).

Imports aiohttp only: `runner.server.connections` (public, oldest first) and each
handler's `transport`.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
IDLE_GRACE = 1.0  # seconds a connection is seen idle before it may be closed for room


class IdleConnections:
    """The HTTP server's connections with no request in progress, closable oldest first."""

    def __init__(self) -> None:
        self.server: web.Server | None = None  # set once the runner is set up
        self.closed = 0  # idle connections closed to make room, in all
        # a request answered: its connection, and whether its body was read whole
        self.ended: Callable[[asyncio.BaseTransport, bool], None] = lambda t, whole: None
        self._busy: dict[asyncio.BaseTransport, int] = {}  # requests in progress on each
        # idle connections: when first seen idle (weakly: a closed one is not kept)
        self._seen: weakref.WeakKeyDictionary[asyncio.BaseTransport, float] = (
            weakref.WeakKeyDictionary()
        )

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        """The app's outermost middleware: marks a connection busy while a request runs."""

        @web.middleware
        async def busy(request: web.Request, handler: Handler) -> web.StreamResponse:
            transport = request.transport
            if transport is None:  # the client already left
                return await handler(request)
            self._busy[transport] = self._busy.get(transport, 0) + 1
            try:
                return await handler(request)
            finally:
                left = self._busy.pop(transport) - 1
                if left:
                    self._busy[transport] = left
                self.ended(transport, request.content.is_eof())

        return busy

    def busy(self, transport: asyncio.BaseTransport) -> bool:
        """Whether a request of this connection is being handled."""
        return transport in self._busy

    def reclaim(self, n: int) -> tuple[int, bool]:
        """Close up to `n` connections idle for IDLE_GRACE or more, oldest first: how
        many (their descriptors are released on the loop's next pass), and whether
        others idle now become closable later. Called on the server's loop. A
        connection is seen idle from the first call that finds it so: one just made
        has that long to send its request head."""
        if self.server is None:
            return 0, False
        now, before = time.monotonic(), self._seen
        seen: weakref.WeakKeyDictionary[asyncio.BaseTransport, float] = weakref.WeakKeyDictionary()
        closable: list[asyncio.BaseTransport] = []
        young = False
        for handler in self.server.connections:  # in the order they were made
            transport = handler.transport
            if transport is None or transport.is_closing() or transport in self._busy:
                continue
            seen[transport] = since = before.get(transport, now)
            if now - since < IDLE_GRACE:
                young = True
            elif len(closable) < n:
                closable.append(transport)
        self._seen = seen  # (the connections idle now: the rest are forgotten)
        for transport in closable:
            transport.abort()
        self.closed += len(closable)
        return len(closable), young
