"""The batch walk passes over jobs that cannot be admitted without changing a decision.

`BatchWalk.run` skips, without considering them, the waiting jobs whose blocks exceed
the admission room and the host jobs once `wanted` is full. These tests hold it to
the walk that considers every job in priority order (`FullWalk`, the walk before the
skip), decision for decision: the batch, the host jobs wanted and upcoming, the room
left, the copies, on random workloads and on the cases that matter by hand (a small
job after a big one that did not fit, the look past a full batch).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fsd.sched.scheduler as scheduler_module
from fsd.jobs import Job, KVLocation
from fsd.sched.batch import BatchWalk
from fsd.sched.registry import POLICIES
from fsd.sched.room import skip_threshold as _skip_threshold
from fsd.sched.scheduler import Scheduler
from tests.sched.harness import drive, make_jobs, scheduler

ALPHAS = ("mlfq", "sj-mlfq", "fsd")  # the policies with an alpha: 0.5 SLOs, promotion often


class FullWalk(BatchWalk):
    """The reference: every candidate goes through `_consider` until the batch is full;
    then the next 4 x max_batch_size candidates are scanned for host jobs."""

    def run(self, candidates: Iterable[Job]) -> None:
        scanned = 0
        for job in candidates:
            if self.taken >= self.limit:
                scanned += 1
                if scanned > 4 * self.limit or len(self.upcoming) >= self.limit:
                    break
                if job.kv is KVLocation.HOST:
                    self.upcoming.append(job)
            elif not self._consider(job):
                break
        if self.decodes_left and self.taken < self.limit:
            self._join_decodes()


def _decision(sched: Scheduler, walk_cls: type[BatchWalk]) -> tuple:
    """One `schedule` on a copy of `sched` with `walk_cls`: everything it decided."""
    twin = copy.deepcopy(sched)
    walks: list[BatchWalk] = []

    def spy(*args: object) -> BatchWalk:
        walks.append(walk_cls(*args))  # type: ignore[arg-type]
        return walks[-1]

    saved = scheduler_module.BatchWalk
    scheduler_module.BatchWalk = spy  # type: ignore[assignment,misc]
    try:
        out = twin.schedule(0.0)
    finally:
        scheduler_module.BatchWalk = saved
    (walk,) = walks
    ids = lambda jobs: [j.job_id for j in jobs]  # noqa: E731
    ops = lambda ops: [(op.job.job_id, op.num_blocks, op.sync) for op in ops]  # noqa: E731
    return (
        ids(out.batch),
        [j.step_tokens for j in out.batch],
        ids(walk.wanted),
        ids(walk.upcoming),
        walk.admit_room,
        ops(out.swap_out),
        ops(out.swap_in),
        ids(out.recomputed),
    )


def _same_as_full_walk(sched: Scheduler) -> None:
    assert _decision(sched, BatchWalk) == _decision(sched, FullWalk)


@pytest.mark.parametrize("room", [-3.5, 0.0, 0.99, 1.0, 2.5, 7.0, 40.0])
def test_the_skip_threshold_is_the_admission_rule(room):
    # a job of t tokens needs ceil((t + 1) / block_size) blocks; it is skipped exactly
    # when that need exceeds the room
    for block_size in (1, 4, 16):
        at = _skip_threshold(room, block_size)
        for tokens in range(1, 200):
            need = -(-(tokens + 1) // block_size)
            assert (tokens >= at) == (need > room), (room, block_size, tokens)
    assert _skip_threshold(float("inf"), 16) == float("inf")


def test_a_small_job_after_a_big_one_that_does_not_fit_is_taken():
    # h holds 20 of the 28 blocks admission allows (0.5 x (32 device + 24 host)); the
    # waiting jobs in priority order: big (16 blocks: over the 8 left), then small (2)
    s = scheduler("fcfs", device=32, host=24, block_size=4, admit_fraction=0.5)
    holder, big, small, last = make_jobs([(79, 50), (60, 5), (6, 5), (30, 5)])
    s.add(holder, 0.0)
    assert [j.job_id for j in s.schedule(0.0).batch] == ["j0"]
    for job in (big, small, last):
        s.add(job, 0.0)
    _same_as_full_walk(s)
    out = s.schedule(0.0)
    # small fits the room big could not use; last (8 blocks) no longer fits after it
    assert [j.job_id for j in out.batch] == ["j0", "j2"]
    assert big.kv is KVLocation.NONE and last.kv is KVLocation.NONE


@pytest.mark.parametrize(("waiting", "upcoming"), [(3, ["h"]), (4, [])])
def test_the_look_past_a_full_batch_counts_the_jobs_that_cannot_start(waiting, upcoming):
    # A batch of one, filled by r; the look past it scans the next 4 jobs for host jobs
    # to bring in. The waiting prompts (51 blocks each, over the admission room) take
    # places in that window as they did when every job was considered: behind 3 of
    # them the host job h is upcoming, behind 4 it is not.
    s = scheduler("fcfs", device=32, host=64, block_size=4, admit_fraction=0.5,
                  max_batch_size=1)  # fmt: skip
    (running,) = make_jobs([(8, 40)], prefix="r")
    s.add(running, 0.0)
    assert s.schedule(0.0).batch == [running]
    for job in make_jobs([(200, 5)] * waiting, prefix="w"):
        s.add(job, 0.0)
    (host,) = make_jobs([(8, 5)], prefix="h")
    s.add(host, 0.0)
    s.blocks.append(host)  # it ran before and was swapped out
    s.blocks.swap_out(host, sync=True)
    assert host.kv is KVLocation.HOST
    assert s.admission_room() < 51
    decision = _decision(s, BatchWalk)
    assert decision == _decision(s, FullWalk)
    batch, upcoming_ids = decision[0], decision[3]
    assert batch == ["r0"]
    assert upcoming_ids == [f"{u}0" for u in upcoming]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(
        st.tuples(st.integers(1, 90), st.integers(1, 12), st.integers(0, 12)),
        min_size=1,
        max_size=16,
    ),
    policy=st.sampled_from(sorted(POLICIES)),
    kv_policy=st.sampled_from(["proactive", "reactive", "recompute", "defer"]),
    admit=st.sampled_from([0.1, 0.3, 0.5, 0.9, 1.0]),
    limit=st.integers(1, 4),
    chunk=st.sampled_from([0, 8, None]),
)
def test_every_decision_matches_the_full_walk(specs, policy, kv_policy, admit, limit, chunk):
    s = scheduler(policy, kv_policy=kv_policy, device=32, host=48, block_size=4,
                  admit_fraction=admit, max_batch_size=limit, prefill_chunk=chunk,
                  rules={"alpha": 0.5} if policy in ALPHAS else None)  # fmt: skip
    jobs = make_jobs([(p, o) for p, o, _ in specs])
    arrivals = {j.job_id: a for j, (_, _, a) in zip(jobs, specs, strict=True)}
    run = drive(s, jobs, arrivals, before=lambda it, now: _same_as_full_walk(s))
    assert sorted(run.finished) == sorted(j.job_id for j in jobs)
