"""What a preview reports over its horizon, computed alike for a twin run and for the
daemon observed over the same minute (bench/whatif.py), so the two compare.

Over the window (t0, t1]:
- per-token latency (end-to-end / output tokens, the paper's metric) of the jobs
  that finish inside it: `avg` and `p95`;
- TTFT of the jobs whose first token comes inside it, and, counted at t1, of those
  arrived but still without one (a censored wait: a lower bound, so starving them
  is not rewarded): `ttft_p99`;
- goodput: the finished jobs within the SLO per second of window;
- `finished`, and `unfinished`: arrived by t1 and not finished by then.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fsd.metrics import percentile
from fsd.protocol_preview import PreviewSide, Spread

FIGURES = PreviewSide.__struct_fields__  # avg, p95, ttft_p99, goodput, finished, ...


@dataclass(frozen=True)
class JobTimes:
    """One job's times as the window sees them (None: not yet)."""

    arrival: float
    first_token: float | None
    finish: float | None
    output_tokens: int


def window_figures(jobs: Iterable[JobTimes], t0: float, t1: float, slo: float) -> dict[str, float]:
    """The latency figures of one run or observation over (t0, t1]."""
    ptl: list[float] = []
    ttft: list[float] = []
    unfinished = 0
    for j in jobs:
        if j.arrival > t1:
            continue
        done = j.finish is not None and j.finish <= t1
        if done and j.finish > t0 and j.output_tokens > 0:  # type: ignore[operator]
            ptl.append((j.finish - j.arrival) / j.output_tokens)  # type: ignore[operator]
        if not done:
            unfinished += 1
        first = j.first_token
        if first is not None and t0 < first <= t1:
            ttft.append(first - j.arrival)
        elif first is None or first > t1:
            ttft.append(t1 - j.arrival)  # still waiting at the end of the window
    arr = np.array(ptl)
    return {
        "avg": float(arr.mean()) if arr.size else math.nan,
        "p95": _pct(arr, 95),
        "ttft_p99": _pct(np.array(ttft), 99),
        "goodput": float((arr <= slo).sum()) / (t1 - t0),
        "finished": float(arr.size),
        "unfinished": float(unfinished),
    }


def _pct(values: np.ndarray, q: float) -> float:
    p = percentile(values, q)
    return math.nan if p is None else p


def spread(values: Sequence[float]) -> Spread:
    """Mean, lowest and highest of the runs that measured it (NaN: none did)."""
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return Spread(mean=math.nan, lo=math.nan, hi=math.nan)
    return Spread(mean=float(np.mean(v)), lo=float(min(v)), hi=float(max(v)))


def side(runs: Sequence[dict[str, float]]) -> PreviewSide:
    """One setting's figures across the seeds' runs."""
    return PreviewSide(**{k: spread([r[k] for r in runs]) for k in FIGURES})
