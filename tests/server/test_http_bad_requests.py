"""A malformed HTTP request costs one short log line per 10 s, never a traceback nor
the request's bytes (aiohttp logged ~800 bytes echoing the request line, per request)."""

from __future__ import annotations

import logging
import socket
import time
import urllib.request
from pathlib import Path

from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, InvalidURLError

from fsd.server.log_limits import BadRequestLog, Throttle, parse_reason
from tests.server.daemon_proc import daemon_fixture

daemon = daemon_fixture("[server]\ntelemetry_hz = 0.0\n", "httpbad", http=True)

MALFORMED = [
    b"GET /\x01SECRET-PATH HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nBad Header SECRET-HEADER\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nContent-Length: SECRET\r\n\r\n",
]


def send(http: str, raw: bytes) -> bytes:
    host, port = http.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(raw)
        return s.recv(200)


def test_malformed_requests_are_one_short_line_per_interval(daemon):
    start = time.monotonic()
    for i in range(30):
        assert send(daemon.http, MALFORMED[i % 3]).startswith(b"HTTP/1.0 400 Bad Request")
    elapsed = time.monotonic() - start
    with urllib.request.urlopen(f"{daemon.http}/v1/models", timeout=30) as resp:
        assert resp.status == 200  # still serving
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = Path(daemon.log).read_text()
        lines = [ln for ln in text.splitlines() if "bad HTTP request from 127.0.0.1: " in ln]
        if lines:
            break
        time.sleep(0.05)
    assert 1 <= len(lines) <= 1 + elapsed // 10, lines
    assert "WARNING" in lines[0] and len(lines[0]) < 200, lines[0]
    assert lines[0].endswith("bad HTTP request from 127.0.0.1: Invalid char in url path")
    assert "SECRET" not in text and "Traceback" not in text
    assert "Error handling request" not in text


def test_the_throttle_lets_one_line_through_per_interval_and_counts_the_rest():
    now = [0.0]
    t = Throttle(10.0, clock=lambda: now[0])
    assert t.take() == 0
    assert [t.take() for _ in range(5)] == [None] * 5
    now[0] = 10.0
    assert t.take() == 5 and t.take() is None
    assert t.total == 8


def test_the_reason_never_carries_the_request_bytes():
    assert parse_reason(InvalidURLError("Invalid char in url path:\n\n  b'GET /x'")) == (
        "Invalid char in url path"
    )
    assert parse_reason(BadStatusLine("GET /SECRET")) == "Bad status line"
    assert parse_reason(BadHttpMessage("")) == "BadHttpMessage"


def test_the_filter_rewrites_parser_errors_and_leaves_handler_failures():
    f = BadRequestLog(10.0)
    exc = BadHttpMessage("Invalid header token:\n\n  b'SECRET'")
    bad = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "Error handling request from %s", ("10.0.0.9",),
        (type(exc), exc, None),
    )  # fmt: skip
    assert (
        f.filter(bad) and bad.getMessage() == "bad HTTP request from 10.0.0.9: Invalid header token"
    )
    assert bad.exc_info is None and bad.levelname == "WARNING"
    again = logging.LogRecord("x", logging.ERROR, __file__, 1, "Error handling request from %s",
                              ("10.0.0.9",), (type(exc), exc, None))  # fmt: skip
    assert not f.filter(again)  # within the interval: held back
    boom = ValueError("a handler's bug")
    own = logging.LogRecord("x", logging.ERROR, __file__, 1, "Unhandled exception", (),
                            (ValueError, boom, None))  # fmt: skip
    assert f.filter(own) and own.exc_info is not None  # keeps its traceback
