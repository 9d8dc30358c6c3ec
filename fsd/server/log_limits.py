"""Log lines a client can cause, bounded: one line per interval, and never its bytes.

`OnceLog` logs each distinct failure once with its traceback (the service's).

A peer that sends malformed HTTP requests, or opens connections until the daemon runs
out of file descriptors, could otherwise write a line (or a traceback) per attempt.
`Throttle` lets one line through per `interval`
seconds and counts the ones it held back into the next. `BadRequestLog` turns
aiohttp's "Error handling request" (an 800-byte traceback echoing the request line)
into one short line naming the peer and the parser's reason, throttled.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger("fsd.server")

LOG_INTERVAL = 10.0  # seconds between two lines of one kind, at most
_REASON_CHARS = 80


class Throttle:
    """At most one line per `interval` seconds; the rest are counted, not logged."""

    def __init__(
        self, interval: float = LOG_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        self.held = 0  # lines held back since the last one let through
        self.total = 0  # every line asked for
        self._last: float | None = None

    def take(self) -> int | None:
        """None: hold this line back. Else log it now: the number held back before it."""
        self.total += 1
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            self.held += 1
            return None
        self._last, held, self.held = now, self.held, 0
        return held


def parse_reason(exc: HttpProcessingError) -> str:
    """The parser's reason in a few words, without the request's bytes (aiohttp quotes
    them after a colon or in quotes: `Invalid char in url path:\\n\\n b'GET /...'`)."""
    first = (exc.message or "").strip().splitlines()[:1]
    words = re.split(r"[:'\"]", first[0], maxsplit=1)[0].strip() if first else ""
    return words[:_REASON_CHARS] or type(exc).__name__


class BadRequestLog(logging.Filter):
    """On the HTTP server's logger: a malformed request is one short throttled line."""

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        super().__init__()
        self.throttle = Throttle(interval)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True  # a handler's own failure keeps its traceback
        held = self.throttle.take()
        if held is None:
            return False
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        more = f" ({held} more since the last such line)" if held else ""
        record.msg, record.args = "bad HTTP request from %s: %s%s", (peer, parse_reason(exc), more)
        record.exc_info = record.exc_text = None
        if record.levelno > logging.WARNING:  # the client's fault, not the daemon's
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def http_server_logger(name: str = "fsd.http.server") -> logging.Logger:
    """The logger aiohttp's request handlers get: `BadRequestLog` on it, once."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, BadRequestLog) for f in logger.filters):
        logger.addFilter(BadRequestLog())
    return logger


class OnceLog:
    """Logs each distinct failure once with its traceback, then only counts it.

    Bounded: it counts `limit` distinct failures at most (a message may name a job, so
    there is no end to them); past that, a new one is logged without its traceback
    and counted in `others`."""

    def __init__(self, limit: int = 200) -> None:
        self.seen: dict[str, int] = {}
        self.limit = limit
        self.others = 0  # failures not counted by message (past `limit` of them)

    def exception(self, what: str, exc: BaseException) -> None:
        key = f"{what}: {type(exc).__name__}: {str(exc)[:200]}"
        count = self.seen.get(key)
        if count is None and len(self.seen) >= self.limit:
            self.others += 1
            if self.others in (1, 10, 100, 1000, 10000):
                log.error("%s (and %d other failures not counted by message)", key, self.others)
            return
        count = count or 0
        if count == 0:
            log.error("%s", key, exc_info=exc)
        elif count in (10, 100, 1000, 10000):
            log.error("%s (%d times so far)", key, count)
        self.seen[key] = count + 1
