"""The measured wait for a first token (fsd.sched.first_tokens): the jobs still waiting
times the backlogged seconds per first token in the last window, or the oldest one's
wait so far if longer."""

from __future__ import annotations

import pytest

from fsd.jobs import Job, SamplingParams
from fsd.sched.first_tokens import MAX_STARTS, MIN_STARTS, FirstTokenWait


def job(name: str, arrival: float = 0.0) -> Job:
    return Job(
        prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=4), job_id=name,
        arrival_time=arrival,
    )  # fmt: skip


def start(w: FirstTokenWait, j: Job, now: float) -> None:
    j.append_token(7, now)
    w.ran(j, now)


def test_no_prediction_until_enough_jobs_started():
    w = FirstTokenWait(window=60.0)
    jobs = [job(f"a{i}") for i in range(MIN_STARTS + 5)]
    for j in jobs:
        w.arrived(j, 0.0)
    for i, j in enumerate(jobs[: MIN_STARTS - 1]):
        start(w, j, 1.0 + i)
    assert w.predicted(job("new"), 10.0) is None


def test_the_wait_is_the_queue_over_the_start_rate():
    w = FirstTokenWait(window=60.0)
    jobs = [job(f"a{i}") for i in range(30)]
    for j in jobs:
        w.arrived(j, 0.0)
    for i, j in enumerate(jobs[:10]):  # ten starts over the first 20 s: 0.5 a second
        start(w, j, 2.0 * (i + 1))
    new = job("new")
    w.arrived(new, 20.0)
    # twenty wait before it (not itself): 20 / 0.5 = 40 s
    assert w.predicted(new, 20.0) == pytest.approx(40.0)
    # a job that ran again, or one that left, changes nothing or shortens the queue
    w.ran(jobs[0], 21.0)
    w.left(jobs[20])
    assert w.predicted(new, 20.0) == pytest.approx(19 / 0.5)


def test_starts_older_than_the_window_no_longer_count():
    w = FirstTokenWait(window=10.0)
    first, later = [job(f"a{i}", 0.0) for i in range(20)], [job(f"b{i}", 19.5) for i in range(20)]
    for j in first:
        w.arrived(j, 0.0)
    for i, j in enumerate(first):  # twenty starts, one a second; twenty more arrive at 19.5
        if i == 19:
            for b in later:
                w.arrived(b, 19.5)
        start(w, j, float(i + 1))
    new = job("new", 20.0)
    # at 20 s: starts within [10, 20] are eleven, ten after the first in 10 s (always
    # backlogged): a second each, twenty waiting
    assert w.predicted(new, 20.0) == pytest.approx(20 * 10.0 / 10)
    # at 40 s none is left within the window: no rate, no prediction
    assert w.predicted(new, 40.0) is None


def test_a_job_already_waiting_longer_than_the_queue_predicts_sets_the_wait():
    # the walk lets short prompts overtake a long one: the queue looks short, but one
    # job taken long ago still has no token; no new one is promised less than its wait
    w = FirstTokenWait(window=60.0)
    old = job("old", 0.0)
    w.arrived(old, 0.0)
    quick = [job(f"q{i}", 50.0) for i in range(MIN_STARTS)]
    for i, j in enumerate(quick):
        w.arrived(j, 50.0)
        start(w, j, 50.0 + i)
    new = job("new", 60.0)
    w.arrived(new, 60.0)
    # one job before it ("old") at 8 starts a minute: 7.5 s; but "old" has waited 60 s
    assert w.predicted(new, 60.0) == pytest.approx(60.0)
    start(w, old, 61.0)  # back to the queue's measure: "new" before it, 8 starts in the
    # 11 s since the first kept
    assert w.predicted(job("later", 61.0), 61.0) == pytest.approx(11.0 / 8)


def test_below_capacity_only_backlogged_seconds_count():
    # one job every 10 s, each started 0.1 s later: 10 starts a minute, but the server
    # was busy with a waiting job 1 s of it; a burst of 20 is predicted a short wait
    w = FirstTokenWait(window=120.0)
    for i in range(10):
        j = job(f"s{i}", 10.0 * i)
        w.arrived(j, 10.0 * i)
        start(w, j, 10.0 * i + 0.1)
    burst = [job(f"b{i}", 100.0) for i in range(20)]
    for j in burst:
        w.arrived(j, 100.0)
    # 19 before the last, 0.1 s per start (not the 9.01 s between starts)
    assert w.predicted(burst[-1], 100.0) == pytest.approx(19 * 0.1)


def test_memory_is_bounded_whatever_the_rate():
    # a thousand starts a second: only the latest MAX_STARTS are kept, and a started
    # job leaves the waiting set
    w = FirstTokenWait(window=60.0)
    for i in range(5000):
        j = job(f"j{i}", i / 1000)
        w.arrived(j, i / 1000)
        start(w, j, i / 1000 + 0.0005)
    assert len(w.starts) == MAX_STARTS and not w.waiting
    assert w.predicted(job("new", 5.0), 5.0) == pytest.approx(0.0)
