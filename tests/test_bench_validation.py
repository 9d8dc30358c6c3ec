"""bench/validation.py's judgement: worst-case regret, the P16 targets, and the default
chosen among the candidates that never thrash."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from judge import choose_default, worst_case  # noqa: E402


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
    # at point 1 "thrash" (4 / 9) thrashes, so the bar there is sj-mlfq (5 / 10); at
    # point 2 it does not (4 / 8); srpt never counts
    assert w["worst_avg_regret"] == (1.25, "w@2")
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
    assert qualifying["late"] == 1.8 > qualifying["steady"] == 1.25


def _past(**runs: dict) -> dict:
    """One point past capacity (FCFS does not sustain it)."""
    fcfs = {**_run(10, 20), "sustainable": False, "ttft": 30.0, "goodput": 0.2}
    return _res({"4": {"fcfs": fcfs, "srpt": _run(1, 2), **runs}})


def test_where_sj_mlfq_thrashes_the_bar_is_the_best_candidate_that_does_not():
    res = _past(
        **{
            "sj-mlfq": {**_run(3, 8, tbt=1.4), "ttft": 20.0, "goodput": 0.5},  # round-robin
            "fsd": {**_run(5, 9), "ttft": 40.0, "goodput": 0.4},
            "calm": {**_run(4.5, 9), "ttft": 25.0, "goodput": 0.3},
        }
    )
    w = worst_case(res, "fsd")
    # sj-mlfq (TBT P99 14x FCFS's) is no bar: the reference is "calm", the best of the
    # rest; fsd's first token (40 s against calm's 25) is within 2x, its goodput the best
    assert w["worst_avg_regret"] == (5 / 4.5, "w@4")
    assert w["misses"] == ["w@4 avg 1.11x calm"]


def test_past_capacity_first_tokens_and_goodput_are_judged():
    res = _past(
        **{
            "sj-mlfq": {**_run(5, 10), "ttft": 10.0, "goodput": 0.5},
            "fsd": {**_run(5, 10), "ttft": 25.0, "goodput": 0.4},
        }
    )
    assert worst_case(res, "fsd")["misses"] == [
        "w@4 mean TTFT 2.50x best",
        "w@4 goodput 0.80x best",
    ]
    assert worst_case(res, "sj-mlfq")["misses"] == []


def test_a_first_token_under_a_second_is_on_time_whatever_the_ratio():
    res = _past(
        **{
            "sj-mlfq": {**_run(5, 10), "ttft": 0.1, "goodput": 0.5},
            "fsd": {**_run(5, 10), "ttft": 0.6, "goodput": 0.5},  # 6x, but within a second
        }
    )
    assert worst_case(res, "fsd")["misses"] == []
