"""Under fsd's swap gate, a short job that comes before every started job starts past
the admission room (fsd.sched.batch, "Short jobs ahead"); a long one still waits."""

from __future__ import annotations

import pytest

from fsd.sched.leads import express_tokens
from fsd.sched.scheduler import Scheduler
from tests.sched.harness import drive, make_jobs, scheduler

ARRIVES = 200  # the late job comes once the started jobs sit low and fill device and host


def _express(sched: Scheduler) -> int:
    return express_tokens(sched.queue, sched.cost, sched.rules)


def _waits(late_output: int, express: bool = True) -> int:
    """Iterations a job of `late_output` tokens waits to be batched, arriving behind
    12 started jobs of 300 tokens that fill the device and most of host memory
    (`express`: fsd's express lane on, as by default)."""
    sched = scheduler("fsd", device=256, host=1024, max_batch_size=4, rules={"express": express})
    longs = make_jobs([(8, 300)] * 12, prefix="long")
    late = make_jobs([(8, late_output)], prefix="late")
    run = drive(sched, longs + late, {"late0": ARRIVES})
    return next(i for i, b in enumerate(run.batches) if "late0" in b) - ARRIVES


def test_the_express_bound_is_what_decodes_within_the_waiting_limit():
    sched = scheduler("fsd")
    waiting = sched.queue.limits()[2]
    assert _express(sched) == int(waiting / sched.cost.decode_line()[0])
    assert _express(scheduler("sj-mlfq")) == 0  # no gate: nothing to pass


def test_a_short_job_ahead_starts_while_started_work_fills_the_device():
    assert _express(scheduler("fsd")) >= 2
    short = _waits(2)
    gated = _waits(2, express=False)
    assert short < 60 and gated > 5 * short, (short, gated)


@pytest.mark.parametrize("express", [True, False])
def test_a_long_job_ahead_still_waits_for_room(express):
    assert _waits(280, express) > 100
