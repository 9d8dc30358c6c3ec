"""The preview's text (console/preview_format.py): spreads, changes, NaN, assumptions."""

from __future__ import annotations

import math

import pytest

from fsd import protocol as P
from fsd.console.preview_format import change_text, preview_lines, spread_text

NAN = math.nan


def spread(mean: float, lo: float | None = None, hi: float | None = None) -> P.Spread:
    return P.Spread(mean=mean, lo=mean if lo is None else lo, hi=mean if hi is None else hi)


def side(avg: float, ttft: P.Spread, preemptions: float) -> P.PreviewSide:
    return P.PreviewSide(
        avg=spread(avg, avg * 0.5, avg * 2), p95=spread(avg * 3), ttft_p99=ttft,
        goodput=spread(2.5, 2.0, 3.0), finished=spread(120.5, 118, 123), unfinished=spread(4),
        preemptions=spread(preemptions), swaps=spread(NAN), peak_kv_blocks=spread(300, 280, 320),
    )  # fmt: skip


def reply(**assumed) -> P.PreviewReply:
    a = dict(
        taken_at=1.7e9, horizon=60.0, seeds=[0, 1, 2, 3], live_jobs=7, sampled_remaining=5,
        arrival_rate=2.5,
        arrival_cv=1.25, arrival_window=90.0, arrivals_seen=220, lengths_from=180,
        clock_scale=1.1, clock_overhead=0.00025, clock_samples=640, slo=0.05,
        notes=["no prefix cache in the twin", "2 jobs had unknown lengths"],
    )  # fmt: skip
    a.update(assumed)
    return P.PreviewReply(
        changes={"policy": "fcfs", "quanta": [0.01, 0.02], "q1": None},
        current=side(0.020, spread(1.5, 1.2, 1.8), 10),
        proposed=side(0.0154, spread(NAN), 0),
        assumptions=P.PreviewAssumptions(**a),
        wall_s=3.24,
    )


def test_the_comparison_table():
    lines = preview_lines(reply())
    assert lines[0] == "preview of policy=fcfs quanta=0.01,0.02 q1=none (nothing applied; the twin ran 3.2 s)"  # fmt: skip
    table = lines[1:11]
    assert [line.split("  ")[0] for line in table[1:]] == [
        "avg per-token (ms)", "P95 per-token (ms)", "P99 TTFT (s)", "goodput (/s)", "finished",
        "unfinished", "preemptions", "swaps", "peak KV blocks",
    ]  # fmt: skip
    rows = {line.split("  ")[0]: line.split() for line in table[1:]}
    assert table[0].split() == ["current", "proposed", "change"]
    assert " ".join(rows["avg per-token (ms)"][3:]) == "20.0 [10.0–40.0] 15.4 [7.7–30.8] -23%"
    assert " ".join(rows["P99 TTFT (s)"][3:]) == "1.50 [1.20–1.80] - -"  # NaN: "-"
    assert " ".join(rows["finished"][1:]) == "120.5 [118–123] 120.5 [118–123] 0%"
    assert " ".join(rows["preemptions"][1:]) == "10 [10–10] 0 [0–0] -100%"
    assert " ".join(rows["swaps"][1:]) == "- - -"
    # the columns line up: every row's proposed cell starts where the header's does
    at = table[0].index("proposed")
    assert all(line[at - 2 : at] == "  " and line[at] != " " for line in table[1:])


def test_the_assumptions():
    lines = preview_lines(reply())
    at = lines.index("assumed:")
    assert lines[at + 1 :] == [
        "  horizon 60 s, 4 seeds (0, 1, 2, 3)",
        "  live jobs 7 (remaining length sampled for 5)",
        "  arrivals 2.50/s, CV 1.25, fitted over the last 90 s (220 arrivals)",
        "  lengths resampled from 180 finished jobs",
        "  clock: iteration = 1.10 × profile + 0.25 ms (from 640 samples)",
        "  SLO 50 ms per token (goodput counts the jobs within it)",
        "  note: no prefix cache in the twin",
        "  note: 2 jobs had unknown lengths",
    ]


def test_no_arrivals_many_seeds_no_notes_and_no_wall_time():
    r = reply(arrival_rate=0.0, seeds=list(range(12)), notes=[], horizon=12.5)
    r.wall_s = 0.0
    lines = preview_lines(r)
    assert lines[0].endswith("(nothing applied)")
    assert "  horizon 12.5 s, 12 seeds (0, 1, 2, 3, 4, 5, 6, 7, ...)" in lines
    assert any(line.startswith("  arrivals: none assumed, fitted over") for line in lines)
    assert not any("note:" in line for line in lines)


@pytest.mark.parametrize(
    ("current", "proposed", "text"),
    [(100, 77, "-23%"), (100, 105, "+5%"), (0, 0, "0%"), (0, 3, "-"), (NAN, 1, "-"),
     (1, NAN, "-"), (100, 100.2, "0%"), (-2, -1, "+50%")],
)  # fmt: skip
def test_change_text(current, proposed, text):
    assert change_text(current, proposed) == text


def test_spread_text():
    assert spread_text(spread(0.0123, 0.01, 0.02), 1e3, 1, 1) == "12.3 [10.0–20.0]"
    assert spread_text(spread(NAN, NAN, NAN)) == "-"
    assert spread_text(spread(3, NAN, 4), 1.0, 1, 0) == "3 [-–4]"
