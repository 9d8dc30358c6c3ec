"""bench/validation.py's judgement: worst-case regret, the P16 targets, and the default
chosen among the candidates that never thrash."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from validation import choose_default, worst_case  # noqa: E402


def _run(avg: float, p95: float, tbt: float = 0.1, swaps: float = 0.0) -> dict:
    return {"avg": avg, "p95": p95, "tbt_p99": tbt, "swaps_per_request": swaps}


def _res(points: dict[str, dict[str, dict]]) -> dict:
    return {"cases": {"w": {"loads": {load: {"runs": runs} for load, runs in points.items()}}}}


RES = _res(
    {
        "1": {
            "fcfs": _run(10, 20), "srpt": _run(1, 2), "sj-mlfq": _run(5, 10),
            "steady": _run(6, 11), "thrash": _run(4, 9, tbt=0.5), "late": _run(9, 18),
        },
        "2": {
            "fcfs": _run(10, 20), "srpt": _run(1, 2), "sj-mlfq": _run(5, 10, swaps=3.0),
            "steady": _run(5, 10), "thrash": _run(4, 8), "late": _run(5, 10),
        },
    }
)  # fmt: skip


def test_worst_case_names_the_worst_point_and_every_miss():
    w = worst_case(RES, "steady")
    # the best non-oracle candidate at point 1 is "thrash" (4 / 9); srpt does not count
    assert w["worst_avg_regret"] == (1.5, "w@1")
    assert w["worst_p95_regret"] == (1.25, "w@2")  # 10 against 8 there
    assert w["misses"] == ["w@1 avg 1.20x sj-mlfq", "w@1 P95 1.10x best"]
    thrash = worst_case(RES, "thrash")
    assert thrash["misses"] == ["w@1 TBT P99 5.0x fcfs"]
    assert worst_case(RES, "sj-mlfq")["most_swaps_per_request"] == (3.0, "w@2")


def test_the_default_is_the_smallest_worst_regret_among_those_that_never_thrash():
    best, qualifying = choose_default(RES)
    # "thrash" has the smallest regrets but misses the time-between-tokens target, and
    # sj-mlfq makes 3 swaps per request at point 2
    assert best == "steady"
    assert set(qualifying) == {"steady", "late"}
    assert qualifying["late"] == 2.25 > qualifying["steady"]
