"""Per-job state of the scheduler is released when the job ends (issue P20).

The lazy timer heaps (MLFQ's starvation clocks, Gittins's FCFS turns) skip stale
entries when they pop them; a job that ends before its timer comes due would stay
there until it did, so they are pruned: never more than twice the queue plus a slack,
and empty once the queue is.
"""

from __future__ import annotations

import random

import pytest

from fsd.jobs import FinishReason
from fsd.sched.levels import HEAP_SLACK
from tests.sched.harness import drive, make_jobs, scheduler

HEAPS = {"fsd": "_starve", "sj-mlfq": "_starve", "mlfq": "_starve", "gittins": "_turns"}


def _specs(n: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """(prompt, output, arrival iteration): long and short jobs, three arriving per step."""
    rng = random.Random(seed)
    return [(rng.choice([2, 9, 30]), rng.choice([1, 3, 25]), i // 3) for i in range(n)]


@pytest.mark.parametrize("policy", sorted(HEAPS))
def test_the_lazy_timer_heaps_stay_within_the_queue_and_empty_with_it(policy: str) -> None:
    sched = scheduler(policy, device=64, host=256, max_batch_size=8)
    specs = _specs(600)
    jobs = make_jobs([(p, o) for p, o, _ in specs], prefix=f"{policy}-")
    arrivals = {j.job_id: a for j, (_, _, a) in zip(jobs, specs, strict=True)}
    sizes: list[int] = []

    def watch(iteration: int, now: float) -> None:
        queue = sched.queue
        heap = getattr(queue, HEAPS[policy])
        assert len(heap) <= 2 * len(queue) + HEAP_SLACK
        sizes.append(len(heap))

    run = drive(sched, jobs, arrivals, before=watch)
    assert len(run.finished) == len(jobs)
    assert max(sizes) > 0  # the heap was in use
    assert getattr(sched.queue, HEAPS[policy]) == []  # and holds no ended job


def test_every_per_job_table_is_empty_once_the_jobs_ended_or_were_aborted() -> None:
    sched = scheduler("fsd", device=64, host=256, max_batch_size=8)
    specs = _specs(400, seed=1)
    jobs = make_jobs([(p, o) for p, o, _ in specs], prefix="t")
    arrivals = {j.job_id: a for j, (_, _, a) in zip(jobs, specs, strict=True)}
    aborted: list[str] = []

    def abort_some(iteration: int, now: float) -> None:  # as the engine aborts: remove, end
        for job in list(sched.jobs())[:1] if iteration % 7 == 3 else []:
            sched.remove(job)
            job.finish(FinishReason.ABORT, now)
            aborted.append(job.job_id)

    run = drive(sched, jobs, arrivals, before=abort_some)
    assert aborted and len(run.finished) + len(aborted) == len(jobs)
    blocks, prefix = sched.blocks, sched.blocks.prefix
    assert not sched.has_unfinished() and not sched.estimates.partial and len(sched.queue) == 0
    assert not prefix._chains and not prefix._attached
    assert not blocks.on_device and not blocks.on_host and not blocks._owners and not blocks.moving
    # the prefix cache's names: one per block a tier still holds, no more
    assert prefix._key and set(prefix._key) == set(prefix.on_device) | set(prefix.on_host)
    assert len(prefix._uid) == len(prefix._key) <= blocks.device.num_blocks + blocks.host.num_blocks
