"""Which HTTP connections may be closed to make room when descriptors run out.

Out of file descriptors, refusing every new connection hands the table to whoever
filled it: 1100 idle connections under a hard limit of 1024 kept new HTTP clients out
(16 of 49 honest requests refused) until the head deadline closed them. An idle
connection (no request being handled: waiting for a head, or kept alive between
requests) loses nothing when closed, since its client just reconnects, so the HTTP
listener closes the oldest idle ones to take new ones (`fsd.server.listen`): a flood of
idle connections churns among itself and a client that speaks gets in. A connection
with a request being read or answered is never closed this way.

Imports aiohttp only: `runner.server.connections` (public, oldest first) and each
handler's `transport`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class IdleConnections:
    """The HTTP server's connections with no request in progress, closable oldest first."""

    def __init__(self) -> None:
        self.server: web.Server | None = None  # set once the runner is set up
        self.closed = 0  # idle connections closed to make room, in all
        self._busy: dict[asyncio.BaseTransport, int] = {}  # requests in progress on each

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

        return busy

    def reclaim(self, n: int) -> int:
        """Close up to `n` idle connections, oldest first: how many (their descriptors
        are released on the loop's next pass). Called on the server's loop."""
        if self.server is None:
            return 0
        closed = 0
        for handler in self.server.connections:  # in the order they were made
            transport = handler.transport
            if transport is None or transport.is_closing() or transport in self._busy:
                continue
            transport.abort()
            closed += 1
            if closed == n:
                break
        self.closed += closed
        return closed
