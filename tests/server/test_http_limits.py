"""HTTP read deadlines and the request-body budget (issue P21, item 2), in process.

The head deadline is aiohttp's keep-alive timer (fsd.server.http.limits): the first
tests pin that behaviour of aiohttp, and fail loudly if a release drops it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp.test_utils import TestServer

from fsd.config import ServerConfig
from fsd.server.http.api import Backend, build_app
from fsd.server.http.limits import BodyBudget, runner_options
from tests.server.test_http_api import offline_backend

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@asynccontextmanager
async def served(backend: Backend, header_timeout: float) -> AsyncIterator[Callable[[], Awaitable[Conn]]]:
    """An HTTP server of `backend` with the daemon's options; yields a connector."""
    opts = runner_options(ServerConfig(http_header_timeout=header_timeout))
    server = TestServer(build_app(backend, 1 << 20))
    await server.start_server(**opts)  # (its constructor drops runner options)
    try:
        yield lambda: asyncio.open_connection(server.host, server.port)
    finally:
        await server.close()


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """All the server sends until it closes the connection (TimeoutError if it does not)."""
    async with asyncio.timeout(seconds):
        try:
            return await reader.read()
        except ConnectionError:
            return b""


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def test_a_connection_without_a_whole_head_is_closed_after_the_head_deadline():
    async def run() -> None:
        async with served(offline_backend(), header_timeout=0.5) as connect:
            silent = await connect()
            trickle = await connect()
            for byte in HEAD[:20]:  # a byte each 0.1 s: never a whole head
                trickle[1].write(bytes([byte]))
                await asyncio.sleep(0.1)
            assert await closed_within(silent[0], 10) == b""
            assert await closed_within(trickle[0], 10) == b""
            # a connection with a whole request stays for it, then idles out
            idle = await connect()
            idle[1].write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await closed_within(idle[0], 10)
            assert answer.startswith(b"HTTP/1.1 200")
            for _, w in (silent, trickle, idle):
                w.close()

    asyncio.run(run())


def _post(length: int, body: bytes) -> bytes:
    return HEAD + f"Content-Length: {length}\r\n\r\n".encode() + body


def test_a_body_that_does_not_arrive_in_time_gets_408_and_its_bytes_go():
    budget = BodyBudget(64 << 20, timeout=0.5, max_body=1 << 20)

    async def run() -> None:
        async with served(offline_backend(bodies=budget), header_timeout=30) as connect:
            r, w = await connect()
            w.write(_post(100_000, b"x" * 60_000))
            await asyncio.sleep(0.2)
            assert budget.held == 100_000  # reserved as declared
            answer = await closed_within(r, 10)  # answered, then closed
            assert answer.startswith(b"HTTP/1.1 408")
            assert b"request_timeout" in answer
            assert budget.held == 0
            w.close()

    asyncio.run(run())


def test_bodies_past_the_byte_budget_get_503_and_ordinary_ones_still_pass():
    # 4 MiB in all; bodies over 64 KiB (a 64th) may fill 3 MiB of it
    budget = BodyBudget(4 << 20, timeout=1.5, max_body=1 << 20)
    honest = json.dumps({"model": "other", "prompt": "x"}).encode()

    async def run() -> None:
        async with served(offline_backend(bodies=budget), header_timeout=30) as connect:
            slow = [await connect() for _ in range(4)]
            for _, w in slow:  # each declares 1 MiB and sends all but its last byte
                w.write(_post(1 << 20, b"x" * ((1 << 20) - 1)))
            # the 4th is past 3 MiB: refused at once, its body not read
            refused = await asyncio.wait_for(slow[3][0].readuntil(b"\r\n\r\n"), 10)
            assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in refused
            assert budget.held == 3 << 20
            r, w = await connect()  # a small body still fits (the last quarter)
            w.write(_post(len(honest), honest))
            line = await asyncio.wait_for(r.readline(), 5)
            assert line.startswith(b"HTTP/1.1 404")  # read and answered: no such model
            for reader, _ in slow[:3]:  # the slow ones: 408 at their deadline, closed
                assert (await closed_within(reader, 10)).startswith(b"HTTP/1.1 408")
            assert budget.held == 0
            for _, writer in [*slow, (r, w)]:
                writer.close()

    asyncio.run(run())


def test_a_chunked_body_counts_as_it_arrives_and_is_capped():
    budget = BodyBudget(64 << 20, timeout=5, max_body=1000)

    async def run() -> None:
        async with served(offline_backend(bodies=budget), header_timeout=30) as connect:
            r, w = await connect()
            w.write(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
            w.write(b"258\r\n" + b"x" * 600 + b"\r\n")
            await asyncio.sleep(0.2)
            assert budget.held == 600
            w.write(b"258\r\n" + b"x" * 600 + b"\r\n")
            line = await asyncio.wait_for(r.readline(), 5)
            assert line.startswith(b"HTTP/1.1 413")
            assert budget.held == 0
            w.close()

    asyncio.run(run())
