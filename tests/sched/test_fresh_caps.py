"""The cold start's caps (`fsd.sched.fresh_caps.FreshCaps`) are kept between walks;
kept, they are always what a walk of the queue would give."""

from __future__ import annotations

import random

from fsd.sched.mlfq import MLFQQueue
from tests.sched.harness import drive, make_jobs, scheduler


def test_the_kept_caps_are_always_a_fresh_walks():
    rng = random.Random(7)
    sched = scheduler("fsd", device=48, host=128, max_batch_size=4)
    queue = sched.queue
    assert isinstance(queue, MLFQQueue) and queue.demote_rule == "gittins"
    specs = [(rng.randint(1, 30), rng.choice([2, 3, 8, 8, 40, 90])) for _ in range(60)]
    jobs = make_jobs(specs)
    arrivals = {j.job_id: rng.randint(0, 150) for j in jobs}
    checked: list[int] = []

    def check(it: int, now: float) -> None:
        queue._fresh.shortest_other(jobs[0])  # walked now if it was stale
        kept, walked = queue._fresh._kept, queue._fresh._walk()
        assert kept[0] == walked[0] and kept[2] == walked[2], (it, kept, walked)
        assert kept[1] is walked[1], (it, kept, walked)  # the one holder, or None for ties
        checked.append(it)

    drive(sched, jobs, arrivals, before=check)
    assert len(checked) > 100
    assert all(j.finish_reason is not None for j in jobs)
