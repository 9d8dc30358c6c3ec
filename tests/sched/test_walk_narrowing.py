"""Once no job may pass the admission room, the walk filters the rest of the queue to
the jobs that could still run (`fsd.sched.waiting.could_run`) without changing a
decision: held to the walk that considers every job (`WholeWalk`) on long queues of
prompts too big for the room, with one owner and with several, with the prefix cache
on and off; and the index of waiting jobs by size it reads."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fsd.sched.batch as batch_module
from fsd.config import CacheConfig, SchedConfig
from fsd.jobs import Job, KVLocation
from fsd.kv.block_manager import BlockManager
from fsd.sched.batch import BatchWalk
from fsd.sched.leads import owner_leads
from fsd.sched.registry import make_scheduler
from fsd.sched.scheduler import Scheduler
from fsd.sched.waiting import WaitingIndex
from tests.sched.harness import COST, drive, make_jobs
from tests.sched.test_walk_early_stop import _decision


class WholeWalk(BatchWalk):
    """The reference: the owners' leads, then every job through `_consider`, in
    priority order, until the batch is full; then the look past it."""

    def run(self, candidates: Iterable[Job]) -> None:
        ctx = self.ctx
        leads = owner_leads(ctx.queue, ctx.waiting.newest.values(), self.leads, self.limit)
        self.lead_ids = {job.job_id for job in leads}
        walk = itertools.chain(leads, candidates)
        for job in walk:
            if not self._consider(job):
                break
            if self.taken >= self.limit:
                self._look_past_full(walk)
                break
        if self.decodes_left and self.taken < self.limit:
            self._join_decodes()


def _same_as_whole_walk(sched: Scheduler) -> None:
    assert _decision(sched, BatchWalk) == _decision(sched, WholeWalk)


@pytest.fixture
def narrowed() -> Iterator[list[int]]:
    """How many walks were narrowed (`could_run` gave a set) while the test ran."""
    count = [0]
    real = batch_module.could_run

    def spy(*args: object) -> set[Job] | None:
        found = real(*args)  # type: ignore[arg-type]
        count[0] += found is not None
        return found

    batch_module.could_run = spy  # type: ignore[assignment]
    try:
        yield count
    finally:
        batch_module.could_run = real


def _scheduler(policy: str, kv_policy: str, prefix: bool, limit: int) -> Scheduler:
    blocks = BlockManager(48, 4, 64)
    cache = CacheConfig(block_size=4, kv_policy=kv_policy, admit_fraction=0.5, prefix_cache=prefix)
    rules = {f"{policy}.alpha": 0.5} if policy != "fcfs" else {}
    config = SchedConfig(policy=policy, max_batch_size=limit, policy_settings=rules)
    return make_scheduler(config, cache, blocks, COST)


def _flood(specs: list[tuple[int, int, int]], owners: int) -> tuple[list[Job], dict[str, int]]:
    """Jobs from (prompt, output, arrival) with owners taken in turn (0: no owner)."""
    jobs = make_jobs([(p, o) for p, o, _ in specs])
    for i, job in enumerate(jobs):
        job.owner = f"o{i % owners}" if owners else None
    return jobs, {j.job_id: a for j, (_, _, a) in zip(jobs, specs, strict=True)}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(
        st.tuples(st.sampled_from([3, 6, 30, 70, 90]), st.integers(1, 10), st.integers(0, 6)),
        min_size=20,
        max_size=40,
    ),
    policy=st.sampled_from(["fsd", "sj-mlfq", "fcfs"]),
    kv_policy=st.sampled_from(["proactive", "recompute"]),
    owners=st.sampled_from([0, 1, 3]),
    prefix=st.booleans(),
    limit=st.integers(1, 4),
)
def test_a_narrowed_walk_decides_as_the_full_walk(specs, policy, kv_policy, owners, prefix, limit):
    s = _scheduler(policy, kv_policy, prefix, limit)
    jobs, arrivals = _flood(specs, owners)
    run = drive(s, jobs, arrivals, before=lambda it, now: _same_as_whole_walk(s))
    assert sorted(run.finished) == sorted(j.job_id for j in jobs)


@pytest.mark.parametrize("policy", ["fsd", "fcfs"])
def test_a_flood_of_big_prompts_narrows_the_walk(policy, narrowed):
    # a few short jobs run while 40 prompts of 23 blocks wait, over the room: the walk
    # narrows, and every decision is still the full walk's
    s = _scheduler(policy, "proactive", False, 2)
    jobs, arrivals = _flood([(6, 8, 0)] * 3 + [(90, 4, 1)] * 40, 0)
    run = drive(s, jobs, arrivals, before=lambda it, now: _same_as_whole_walk(s))
    assert len(run.finished) == len(jobs)
    assert narrowed[0] > 0


def test_the_index_finds_the_waiting_jobs_under_a_size():
    live: dict[str, Job] = {}
    index = WaitingIndex(live)
    small, mid, big = make_jobs([(3, 2), (10, 2), (40, 2)])
    for job in (big, small, mid):
        live[job.job_id] = job
        index.add(job)
    assert index.below(11, 3) == [small, mid]
    assert index.below(11, 1) is None  # more than it is worth
    assert index.below(3, 0) == []
    assert index.below(float("inf"), 3) == [small, mid, big]
    small.kv = KVLocation.DEVICE
    index.started([small])
    assert index.below(50, 9) == [mid, big]
    small.kv = KVLocation.NONE  # its KV dropped, one output token later
    small.output_token_ids.append(7)
    index.dropped([small])
    assert index.below(4, 9) == [] and index.below(5, 9) == [small]
    del live[mid.job_id]
    index.remove(mid)
    assert index.below(50, 9) == [small, big]
    assert dict(index.owners) == {None: 2} and index.newest == {}
