"""Owners take turns inside a level (fsd.sched.fair_share): one client's backlog does
not push another's jobs to the back, and one owner's queue is exactly the FIFO it was."""

from __future__ import annotations

import contextlib
import random

import pytest

from fsd.jobs import Job, SamplingParams
from fsd.sched.mlfq import MLFQQueue
from tests.sched.harness import drive, make_jobs, scheduler
from tests.sched.test_mlfq import QUANTA, cost, run_once


def owned(name: str, owner: str | None, prompt: int = 4) -> Job:
    job = Job(prompt_token_ids=[1] * prompt, params=SamplingParams(max_tokens=100), job_id=name)
    job.owner = owner
    return job


def level_order(q: MLFQQueue, level: int) -> list[str]:
    return [j.job_id for j in q.ordered() if j.level == level]


def test_a_newcomer_goes_behind_the_running_turn_not_behind_the_backlog():
    q = MLFQQueue(cost(), QUANTA, starve_limit=1e9)
    flood = [owned(f"a{i}", "alice") for i in range(1000)]
    for job in flood:
        q.add(job, 0.0)
    run_once(q, flood[0], 1.0)  # alice's first job has had its turn at this level
    bob = owned("b0", "bob")
    q.add(bob, 2.0)
    order = level_order(q, bob.level)
    assert order.index("b0") <= 2, order[:5]
    assert len(q) == 1001
    # the order is the key's order, and stays it after more arrivals
    later = owned("a-late", "alice")
    q.add(later, 3.0)
    jobs = list(q.ordered())
    assert jobs == sorted(jobs, key=q.key)
    assert [j.job_id for j in jobs][-1] == "a-late"


def test_owners_alternate_job_by_job():
    q = MLFQQueue(cost(), QUANTA, starve_limit=1e9)
    for i in range(4):
        q.add(owned(f"a{i}", "alice"), 0.0)
    for i in range(4):
        q.add(owned(f"b{i}", "bob"), 1.0)
    q.add(owned("c0", None), 2.0)
    assert level_order(q, 1) == ["a0", "b0", "c0", "a1", "b1", "a2", "b2", "a3", "b3"]


def test_ranks_and_views_follow_the_turns():
    q = MLFQQueue(cost(), QUANTA, starve_limit=1e9)
    for i in range(3):
        q.add(owned(f"a{i}", "alice"), 0.0)
    bob = owned("b0", "bob")
    q.add(bob, 1.0)
    assert q.rank(bob) == 1 and q.ranks()["b0"] == 1
    (view,) = [v for v in q.levels() if v.job_ids]
    assert list(view.job_ids) == ["a0", "b0", "a1", "a2"]
    assert q.level_backlog(bob, batch_size=1) == pytest.approx(QUANTA[1])


@pytest.mark.parametrize("seed", range(5))
def test_one_owner_keeps_the_fifo_it_had(seed):
    """The same random adds, runs and removals on a fair queue and on one that is
    not: with one owner both order every job the same way at every step."""
    rng = random.Random(seed)
    fair = MLFQQueue(cost(decode=0.7), QUANTA, starve_limit=5.0, demote_rule="always")
    plain = MLFQQueue(cost(decode=0.7), QUANTA, starve_limit=5.0, demote_rule="always")
    plain.fair = False
    twins: dict[str, tuple[Job, Job]] = {}
    now = 0.0
    for step in range(400):
        now += 0.5
        op = rng.random()
        if op < 0.4 or not twins:
            prompt = rng.choice([4, 120, 300, 900])
            pair = (owned(f"j{step}", "solo", prompt), owned(f"j{step}", "solo", prompt))
            twins[pair[0].job_id] = pair
            fair.add(pair[0], now)
            plain.add(pair[1], now)
        elif op < 0.85:
            name = rng.choice(sorted(twins))
            for q, job in zip((fair, plain), twins[name], strict=True):
                run_once(q, job, now)
        else:
            name = rng.choice(sorted(twins))
            for q, job in zip((fair, plain), twins.pop(name), strict=True):
                q.remove(job)
        fair.tick(now)
        plain.tick(now)
        assert [j.job_id for j in fair.ordered()] == [j.job_id for j in plain.ordered()]


@pytest.mark.parametrize("seed", range(5))
def test_many_owners_are_always_in_turn_order(seed):
    """Random adds from owners at uneven paces, runs (demotions, promotions) and
    removals, and a retune to fewer levels midway: every level reads in (round,
    queue_seq) order at every step, and the views and ranks say the same."""
    rng = random.Random(seed)
    q = MLFQQueue(cost(decode=0.7), QUANTA, starve_limit=5.0, demote_rule="always")
    jobs: dict[str, Job] = {}
    now = 0.0
    for step in range(600):
        now += 0.5
        op = rng.random()
        if op < 0.45 or not jobs:
            owner = rng.choice(["a", "a", "a", "b", "c", None])  # "a" floods
            job = owned(f"j{step}", owner, rng.choice([4, 120, 300, 900]))
            jobs[job.job_id] = job
            q.add(job, now)
        elif op < 0.85:
            run_once(q, jobs[rng.choice(sorted(jobs))], now)
        else:
            q.remove(jobs.pop(rng.choice(sorted(jobs))))
        if step == 300:  # fewer levels: jobs fold into the last one
            fewer = MLFQQueue(cost(decode=0.7), QUANTA[:2], starve_limit=5.0, demote_rule="always")
            assert q.adopt(fewer)
        q.tick(now)
        ordered = list(q.ordered())
        assert sorted(j.job_id for j in ordered) == sorted(jobs)
        assert ordered == sorted(ordered, key=q.key)
        assert [i for v in q.levels() for i in v.job_ids] == [j.job_id for j in ordered]


def _bob_finishes(owners: bool) -> int:
    """The iteration bob's 2-token job finishes while alice holds 400 jobs."""
    sched = scheduler("fsd", device=256, host=1024, max_batch_size=8)
    alice = make_jobs([(8, 40)] * 400, prefix="a")
    bob = make_jobs([(8, 2)], prefix="b")
    for job in alice:
        job.owner = "alice" if owners else None
    bob[0].owner = "bob" if owners else None
    seen: list[int] = []

    def watch(it: int, now: float) -> None:
        if not seen and bob[0].finish_reason is not None:
            seen.append(it)

    drive(sched, alice + bob, {"b0": 30}, before=watch)
    return seen[0]


def test_another_clients_short_job_is_not_held_behind_a_backlog():
    fair, fifo = _bob_finishes(owners=True), _bob_finishes(owners=False)
    assert fair - 30 < 20, fair
    assert fifo - 30 > 10 * (fair - 30), (fair, fifo)


def _flood_then(
    short: list[tuple[str, int]], arrive: int, every: int = 0, leads: bool = True
) -> dict[str, int]:
    """Ten owners' 100 long jobs each fill device and batch under fsd's gate; `short`
    ((owner, tokens) jobs) arrive from iteration `arrive`, `every` iterations apart:
    the iterations each of them waited for its first token (`leads`: fsd.owner_leads)."""
    sched = scheduler("fsd", device=64, host=256, block_size=16, max_batch_size=8,
                      rules={"owner_leads": leads})  # fmt: skip
    flood = []
    for c in range(10):
        for job in make_jobs([(3, 900)] * 100, prefix=f"f{c}-"):
            job.owner = f"c{c}"
            flood.append(job)
    late = make_jobs([(3, n) for _, n in short], prefix="s")
    for job, (owner, _) in zip(late, short, strict=True):
        job.owner = owner
    first: dict[str, int] = {}
    at = {job.job_id: arrive + every * k for k, job in enumerate(late)}

    def watch(it: int, now: float) -> None:
        for job in late:
            if job.num_output_tokens and job.job_id not in first:
                first[job.job_id] = it - at[job.job_id]
        if len(first) == len(late):
            raise StopIteration

    with contextlib.suppress(StopIteration):
        drive(sched, flood + late, at, before=watch)
    return first


@pytest.mark.parametrize("arrive", [50, 200])
def test_a_client_with_nothing_running_gets_its_short_job_in_at_once(arrive):
    # the flood's started jobs hold the batch and the device; bob holds nothing
    assert _flood_then([("bob", 2)], arrive)["s0"] <= 2
    assert _flood_then([("bob", 2)], arrive, leads=False)["s0"] > 5  # what turns alone gave


def test_owners_leads_are_one_each_and_never_long():
    # carol's five short jobs: one at a time; dave's long one waits its turn as before
    first = _flood_then([("carol", 2)] * 5 + [("dave", 400)], 50)
    carol = [first[f"s{i}"] for i in range(5)]
    assert len(set(carol)) == 5 and min(carol) <= 2, carol
    assert first["s5"] > 5


def test_a_client_sending_one_short_job_after_another_is_served_each_time():
    # each of bob's jobs takes a later turn at its level than the flood's queued jobs,
    # which never run there; its latest job is found wherever it waits
    first = _flood_then([("bob", 2)] * 30, 50, every=10)
    assert max(first.values()) <= 2, first
