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


@dataclass(frozen=True)
class Finish:
    """One finished job's numbers."""

    time: float
    per_token_latency: float
    ttft: float
    tokens: int
    preemptions: int = 0
    swaps: int = 0  # KV copies out and back in


class SLOWindow:
    """Finished jobs of the last `window` seconds and their latency statistics."""

    def __init__(self, window: float, slo_per_token_latency: float) -> None:
        self.window = window
        self.slo = slo_per_token_latency
        self._items: deque[Finish] = deque()

    def add(self, item: Finish) -> None:
        self._items.append(item)

    def _prune(self, now: float) -> list[Finish]:
        while self._items and self._items[0].time < now - self.window:
            self._items.popleft()
        return list(self._items)

    def stats(self, now: float) -> dict[str, float | int | None]:
        items = self._prune(now)
        ptl = [i.per_token_latency for i in items]
        ttft = [i.ttft for i in items]
        span = self.window if items else 1.0
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
