"""Under fsd's swap gate, a short job that comes before every started job starts past
the admission room (fsd.sched.batch, "Short jobs ahead"); a long one still waits."""

from __future__ import annotations

import pytest

import fsd.sched.batch as batch
from fsd.sched.batch import express_tokens
from tests.sched.harness import drive, make_jobs, scheduler

ARRIVES = 200  # the late job comes once the started jobs sit low and fill device and host


def _waits(late_output: int) -> int:
    """Iterations a job of `late_output` tokens waits to be batched, arriving behind
    12 started jobs of 300 tokens that fill the device and most of host memory."""
    sched = scheduler("fsd", device=256, host=1024, max_batch_size=4)
    longs = make_jobs([(8, 300)] * 12, prefix="long")
    late = make_jobs([(8, late_output)], prefix="late")
    run = drive(sched, longs + late, {"late0": ARRIVES})
    return next(i for i, b in enumerate(run.batches) if "late0" in b) - ARRIVES


def test_the_express_bound_is_what_decodes_within_the_waiting_limit():
    sched = scheduler("fsd")
    waiting = sched.queue.limits()[2]
    assert express_tokens(sched) == int(waiting / sched.cost.decode_line()[0])
    assert express_tokens(scheduler("sj-mlfq")) == 0  # no gate: nothing to pass


def test_a_short_job_ahead_starts_while_started_work_fills_the_device(monkeypatch):
    assert express_tokens(scheduler("fsd")) >= 2
    short = _waits(2)
    monkeypatch.setattr(batch, "express_tokens", lambda sched: 0)
    gated = _waits(2)
    assert short < 60 and gated > 5 * short, (short, gated)


@pytest.mark.parametrize("express", [True, False])
def test_a_long_job_ahead_still_waits_for_room(monkeypatch, express):
    if not express:
        monkeypatch.setattr(batch, "express_tokens", lambda sched: 0)
    assert _waits(280) > 100
