"""Collecting garbage and giving freed heap back to the system once the daemon goes idle.

Request handling leaves reference cycles that only Python's full collection frees; left to its
own thresholds that runs rarely, and mid-step, so a daemon after a burst holds that
garbage for minutes (docs/history.md). Here a full collection runs when the loop has
gone idle instead.

glibc's malloc keeps the memory of freed objects in its arenas for reuse; after a
burst of requests a long-lived daemon's RSS then stays at the burst's peak although
the objects are gone, which reads as a leak to an operator and to a soak test. `malloc_trim(0)` returns the free
pages; it costs a few milliseconds, so it runs only once the loop has been idle for
`settle` (1 s) after work, at most once per idle spell and per `min_interval` (2 s):
under 1% of an idle second. Elsewhere than glibc it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("fsd.server")


def _glibc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # musl, macOS: no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class IdleTrim:
    """The loop's duty: `tick(busy)` every pass; once per idle spell after work, a full
    garbage collection, then the heap trimmed."""

    def __init__(
        self,
        settle: float = 1.0,
        min_interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settle = settle  # seconds idle before trimming
        self.min_interval = min_interval
        self.clock = clock
        self.trims = 0
        self._trim = _glibc_trim()
        self._worked = False  # work since the last trim
        self._idle_since: float | None = None
        self._last = -float("inf")

    def tick(self, busy: bool) -> None:
        now = self.clock()
        if busy:
            self._worked = True
            self._idle_since = None
            return
        if self._idle_since is None:
            self._idle_since = now
        ready = now - self._idle_since >= self.settle and now - self._last >= self.min_interval
        if self._worked and ready:
            self._worked = False
            self._last = now
            self.trims += 1
            t0 = time.perf_counter()
            found = gc.collect()
            if self._trim is not None:
                self._trim(0)
            log.debug(
                "idle: %d objects collected, freed heap returned (%.1f ms)",
                found, (time.perf_counter() - t0) * 1e3,
            )  # fmt: skip
