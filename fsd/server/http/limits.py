"""How long an HTTP connection may take to speak, and what its request body may hold.

* The request head: aiohttp (3.14, `web_protocol.RequestHandler`) arms its keep-alive
  timer when a connection opens and again after each response, and closes the
  connection when the timer fires while it still waits for a complete head. So its
  `keepalive_timeout` *is* a head deadline, counted from the opening (or the last
  response): a connection that sends nothing, or a head byte by byte, is closed after
  `http_header_timeout`, and an idle keep-alive connection after the same time.
  No private part of aiohttp is touched; tests/server/test_http_limits.py fails
  loudly if an aiohttp release stops doing this.
* The body: read only within `http_body_timeout` seconds of its head, a fixed
  deadline rather than a minimum rate, so no body holds memory longer than that
  however it trickles; past it the client gets 408 and the connection closes, the
  partial body dropped. aiohttp's own `request.read()` is not used: it raises its
  buffer to the whole `client_max_size` and has no deadline.
* All bodies being read at once, over every connection, hold at most
  `http_max_inflight_bytes`; a body that would pass it is not read, its request
  gets 503 with Retry-After. A body counts from its declared Content-Length (a
  chunked one as it arrives). Large bodies (over a 64th of the budget) may fill only
  three quarters of it, so slow large bodies never keep ordinary requests out.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from fsd.config import ServerConfig
from fsd.server.http.openai_errors import APIError, bad_request

RETRY_AFTER_S = 1  # what a client refused for the byte budget is told to wait


def runner_options(cfg: ServerConfig) -> dict[str, Any]:
    """aiohttp's per-connection options: the head deadline (see the module doc)."""
    return {"keepalive_timeout": cfg.http_header_timeout}


class BodyError(APIError):
    """A body refused or cut off: answered with `headers`, then the connection closed
    if `close` (the rest of that body is never read)."""

    def __init__(
        self, status: int, message: str, code: str, headers: dict[str, str], close: bool
    ) -> None:
        kind = "invalid_request_error" if status < 500 else "service_unavailable"
        super().__init__(status, message, kind, None, code)
        self.headers, self.close = headers, close

    async def answer(self, request: web.Request, resp: web.StreamResponse) -> None:
        """Send `resp` now, and close the connection behind it when asked to."""
        resp.headers.update(self.headers)
        if not self.close:
            return
        resp.force_close()
        await resp.prepare(request)
        await resp.write_eof()
        if request.transport is not None:  # sends what is written, then closes
            request.transport.close()


@dataclass
class BodyBudget:
    """The bytes of the request bodies being read, across connections."""

    limit: int  # http_max_inflight_bytes
    timeout: float  # http_body_timeout
    max_body: int  # one body's most bytes (413 past it)
    held: int = 0

    def take(self, n: int, size: int) -> bool:
        """Reserve `n` more bytes for a body of `size` bytes so far; False: no room."""
        large = size > self.limit // 64
        room = self.limit - self.limit // 4 if large else self.limit
        if self.held + n > room:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


def _too_large(max_body: int) -> APIError:
    return APIError(
        413, f"the request body is larger than {max_body} bytes",
        "invalid_request_error", None, "request_too_large",
    )  # fmt: skip


def _busy() -> BodyError:
    return BodyError(
        503,
        "the server is reading too many request bodies at once; retry later",
        "server_busy", {"Retry-After": str(RETRY_AFTER_S)}, close=False,
    )  # fmt: skip


async def read_body(request: web.Request, budget: BodyBudget) -> bytes:
    """The whole body, within the budget's deadline and byte budget."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # the server does not decompress (server)
        raise APIError(
            415,
            f"fsd takes request bodies uncompressed, not with Content-Encoding: {encoding[:40]}",
            "invalid_request_error",
        )
    declared = request.content_length or 0
    if declared > budget.max_body:
        raise _too_large(budget.max_body)
    if not budget.take(declared, declared):
        raise _busy()
    held, got = declared, 0
    chunks: list[bytes] = []  # each as the parser gave it: no copy until the end
    try:
        async with asyncio.timeout(budget.timeout):
            while chunk := await request.content.readany():
                got += len(chunk)
                if got > budget.max_body:
                    raise _too_large(budget.max_body)
                if got > held:  # chunked, or more than declared (the parser stops that)
                    if not budget.take(got - held, got):
                        raise _busy()
                    held = got
                chunks.append(chunk)
        return b"".join(chunks)
    except TimeoutError:
        raise BodyError(
            408, f"the request body did not arrive within {budget.timeout:g} s",
            "request_timeout", {}, close=True,
        ) from None  # fmt: skip
    except web.RequestPayloadError as exc:  # a body aiohttp could not take apart
        message = " ".join(str(exc).split())  # aiohttp's text spans lines
        raise bad_request(f"the request body cannot be read: {message}") from None
    finally:
        chunks.clear()  # the partial body goes now, not with the traceback
        budget.give(held)
