"""The window figures a preview reports and the bench observes."""

from __future__ import annotations

import math

import pytest

from fsd.twin.figures import JobTimes, side, spread, window_figures


def test_window_figures_count_what_happened_inside_the_window() -> None:
    jobs = [
        JobTimes(0.0, 1.0, 5.0, 10),  # finished before the window: not counted
        JobTimes(8.0, 9.0, 12.0, 4),  # first token before, finish inside: 1.0 s/token
        JobTimes(11.0, 11.5, 13.0, 2),  # inside: 1.0 s/token, TTFT 0.5
        JobTimes(12.0, 14.0, 30.0, 10),  # first token inside (TTFT 2), finishes after
        JobTimes(15.0, None, None, 10),  # still waiting at the end: TTFT counted as 5
        JobTimes(25.0, None, None, 3),  # arrives after the window: not counted
    ]
    f = window_figures(jobs, 10.0, 20.0, slo=1.0)
    assert f["finished"] == 2 and f["unfinished"] == 2
    assert f["avg"] == pytest.approx(1.0) and f["p95"] == pytest.approx(1.0)
    assert f["goodput"] == pytest.approx(2 / 10)
    assert f["ttft_p99"] == pytest.approx(5.0, abs=0.1)  # the waiting job's 5 s leads


def test_an_empty_window_has_no_latency_but_counts_zero() -> None:
    f = window_figures([], 0.0, 60.0, slo=0.1)
    assert math.isnan(f["avg"]) and math.isnan(f["ttft_p99"])
    assert f["finished"] == 0 and f["goodput"] == 0


def test_spread_skips_runs_that_measured_nothing() -> None:
    s = spread([2.0, math.nan, 4.0])
    assert (s.mean, s.lo, s.hi) == (3.0, 2.0, 4.0)
    assert math.isnan(spread([math.nan]).mean)
    figs = {"avg": 1.0, "p95": 2.0, "ttft_p99": 3.0, "goodput": 4.0, "finished": 5.0,
            "unfinished": 0.0, "preemptions": 1.0, "swaps": 2.0, "peak_kv_blocks": 9.0}  # fmt: skip
    both = side([figs, {**figs, "avg": 3.0}])
    assert both.avg.mean == 2.0 and both.avg.lo == 1.0 and both.peak_kv_blocks.hi == 9.0
