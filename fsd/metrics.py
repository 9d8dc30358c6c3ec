"""Latency statistics over a sliding window of finished jobs (per-token latency as
the paper defines it: end-to-end latency divided by output tokens)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """The q-th percentile (0..100), numpy's linear interpolation; None for no values.

    The one percentile of fsd: the daemon's SLO window, the simulator and the benches.
    """
    if len(values) == 0:
        return None
    return float(np.percentile(values, q))


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


# finished jobs the SLO window holds at most (about 140 bytes each): at 1,000 jobs/s
# a 60 s window would hold 60,000; past the cap the statistics are over the latest ones
MAX_FINISHES = 20_000


@dataclass(frozen=True, slots=True)
class Finish:
    """One finished job's numbers."""

    time: float
    per_token_latency: float
    ttft: float
    tokens: int
    preemptions: int = 0
    swaps: int = 0  # KV copies out and back in


class SLOWindow:
    """Finished jobs of the last `window` seconds and their latency statistics.

    Bounded: older jobs leave on every `add` (not only when statistics are read) and
    at most `cap` are held; when more finished within the window, the statistics are
    over the latest `cap` and the rates over the time those span.
    """

    def __init__(
        self, window: float, slo_per_token_latency: float, cap: int = MAX_FINISHES
    ) -> None:
        self.window = window
        self.slo = slo_per_token_latency
        self._items: deque[Finish] = deque(maxlen=cap)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: Finish) -> None:
        self._items.append(item)
        self._prune(item.time)

    def _prune(self, now: float) -> None:
        items, oldest = self._items, now - self.window
        while items and items[0].time < oldest:
            items.popleft()

    def stats(self, now: float) -> dict[str, float | int | None]:
        self._prune(now)
        items = list(self._items)
        ptl = [i.per_token_latency for i in items]
        ttft = [i.ttft for i in items]
        span = self.window if items else 1.0
        if len(items) == self._items.maxlen:  # capped: the rates are over what is held
            span = min(span, max(now - items[0].time, 1e-9))
        return {
            "window": self.window,
            "finished": len(items),
            "avg_per_token_latency": mean(ptl),
            "p95_per_token_latency": percentile(ptl, 95),
            "avg_ttft": mean(ttft),
            "p95_ttft": percentile(ttft, 95),
            "tokens_per_s": sum(i.tokens for i in items) / span,
            "requests_per_s": len(items) / span,
            "slo_per_token_latency": self.slo,
            # thrashing shows here first: preemptions and swaps per finished request
            "preemptions_per_request": mean([i.preemptions for i in items]),
            "swaps_per_request": mean([i.swaps for i in items]),
        }
