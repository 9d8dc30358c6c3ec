"""The fast prefix cache (fsd.kv.prefix, P16) against the plain one it replaced
(tests/kv/prefix_reference.py): random traffic over a small shared vocabulary is
replayed on both, and after every step they must agree on everything the cache
decides: each copy handed to the sink (in order), each job's tables, names and
counts, every pool's free list, LRU order and reference counts, and the names.

Both kinds of job: the engine's (its blocks named by token ids, its outputs shared
too) and the simulator's (a trace's prefix-block hashes, outputs never shared).
Waiting jobs are attached and detached again and again while other jobs evict and
rename their blocks: what a lookup remembers between calls must never change the
answer.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import pytest

from fsd.jobs import Job, KVLocation, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.sim.job import SimJob
from tests.kv.prefix_reference import ReferenceBlockManager, ReferencePrefixCache

_ids = itertools.count()
SP = SamplingParams(max_tokens=8)


class Side:
    """One implementation, its jobs and the copies its cache made."""

    def __init__(self, bm: BlockManager) -> None:
        self.bm = bm
        self.copies: list[tuple[str, list[int], list[int]]] = []
        # block by block: the fast cache moves a take's evictions down in one copy
        bm.prefix.sink = lambda op: self.copies.extend(
            (op.direction, [s], [d]) for s, d in zip(op.src, op.dst, strict=True)
        )
        # a copy back from the host pays only when it is short or starts late (both
        # answers happen): the same rule on both sides
        bm.prefix.worth_copy = lambda n, start: n <= 2 or start >= 4
        self.jobs: list[Any] = []

    def state(self) -> tuple:
        bm, p = self.bm, self.bm.prefix
        pools = [
            (
                pool.free_ids(),
                pool.idle_ids(),
                [pool.refs(b) for b in range(pool.num_blocks)],
                list(pool.cached.items()),
                pool.evictions,
            )
            for pool in (bm.device, bm.host)
        ]
        jobs = [
            (
                j.kv,
                list(j.block_table),
                list(j.host_block_table),
                list(j.prefix_uids),
                j.num_computed_tokens,
                j.num_cached_tokens,
                j.num_tokens,
            )
            for j in self.jobs
        ]
        names = (list(p._uid.items()), list(p._key.items()))
        tiers = (list(p.on_device.items()), list(p.on_host.items()))
        counts = (p.queries, p.hits, p.host_hits, dict(p._attached), p.enabled)
        return pools, jobs, names, tiers, counts, list(self.copies)


def make_job(sim: bool, tokens: list[int], trim: int, bs: int) -> Any:
    job_id = f"j{next(_ids)}"
    if sim:  # each token is one trace block's hash, covering 2 cache blocks
        hb = 2 * bs
        return SimJob(job_id, 0.0, max(1, len(tokens) * hb - trim), 3, tuple(tokens), hb)
    return Job(list(tokens), SP, job_id=job_id)


def grow(job: Any, token: int) -> None:
    if isinstance(job, SimJob):
        job._store_token(token, 0.0)
    else:
        job.output_token_ids.append(token)


def shrink(job: Any) -> None:
    if isinstance(job, SimJob):
        job.num_tokens -= 1
        job.output_count -= 1
    else:
        job.output_token_ids.pop()


def run(bm: BlockManager, job: Any) -> None:
    """Compute every token the job has not (its blocks are there), and name them."""
    bm.append(job)
    job.num_computed_tokens = job.num_tokens
    bm.prefix.commit(job, job.block_table)


def apply(side: Side, op: str, k: int, arg: list[int], flag: bool, bs: int, sim: bool) -> Any:
    """One step of traffic on one side; returns what the step answered."""
    bm, jobs = side.bm, side.jobs
    waiting = [j for j in jobs if j.kv is KVLocation.NONE]
    on_device = [j for j in jobs if j.kv is KVLocation.DEVICE]
    on_host = [j for j in jobs if j.kv is KVLocation.HOST]
    if op == "new":
        # a prompt that starts like one of three others, then differs
        base = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 9, 9], [5, 6, 7, 8, 1, 2]][k % 3]
        j = make_job(sim, base[: 1 + k % len(base)] + arg, k % (2 * bs), bs)
        jobs.append(j)
        return bm.prefix.peek(j)
    if op == "try" and waiting:  # the batch walk: attach, and run it or give it back
        j = waiting[k % len(waiting)]
        planned = bm.prefix.plan(j)
        got = bm.attach(j)
        assert planned == (got, len(j.block_table))  # what attach gave, said before
        if (flag or k % 2) and bm.missing(j) <= bm.device.num_free:
            run(bm, j)  # its held run comes back: copies
            return got, True
        bm.detach(j)  # nothing copied
        return got, False
    if op == "peek" and waiting:
        return bm.prefix.peek(waiting[k % len(waiting)])
    if op == "step" and on_device:
        j = on_device[k % len(on_device)]
        grow(j, arg[0])
        if bm.missing(j) <= bm.device.num_free:
            run(bm, j)
            return True
        shrink(j)
        return False
    if op == "drop" and on_device:  # recompute: its KV is gone, it waits again
        j = on_device[k % len(on_device)]
        bm.free(j)
        j.num_computed_tokens = 0
        return None
    if op == "release" and jobs:
        j = jobs[k % len(jobs)]
        bm.release(j)
        jobs.remove(j)
        return None
    if op == "out" and on_device:
        j = on_device[k % len(on_device)]
        ok, freed = bm.can_swap_out(j), bm.freed_by(j)
        if ok:
            op_ = bm.swap_out(j, sync=flag)
            if not flag:
                bm.swap_done(op_)
        return ok, freed
    if op == "in" and on_host:
        j = on_host[k % len(on_host)]
        ok = bm.can_swap_in(j)
        if ok:
            op_ = bm.swap_in(j, sync=flag)
            if not flag:
                bm.swap_done(op_)
        return ok
    if op == "toggle":  # the scheduler's retune: off forgets every cached block
        if bm.prefix.enabled:
            bm.prefix.clear()
            bm.prefix.enabled = False
        else:
            bm.prefix.enabled = True
        return None
    return None


OPS = ["new", "new", "try", "try", "try", "peek", "step", "drop", "release", "out", "in"]


def replay(seed: int, steps: int) -> dict[str, int]:
    """Random traffic on both sides (the seed picks the pools, the kind of job and
    every step); they must agree after each step. Returns what the fast side did."""
    rng = random.Random(seed)
    device, host, bs = rng.randint(4, 24), rng.randint(0, 16), rng.choice([1, 2, 4])
    sim = rng.random() < 0.5
    fast = Side(BlockManager(device, bs, host))
    plain = Side(ReferenceBlockManager(device, bs, host))
    assert isinstance(plain.bm.prefix, ReferencePrefixCache)
    for step in range(steps):
        # rarely, the scheduler's retune turns the cache off (forgetting it) or back on
        op = "toggle" if rng.random() < 0.01 else rng.choice(OPS)
        k, flag = rng.randint(0, 11), rng.random() < 0.5
        arg = [rng.randint(1, 4) for _ in range(rng.randint(1, 10))]
        answers = [apply(side, op, k, arg, flag, bs, sim) for side in (fast, plain)]
        assert answers[0] == answers[1], (seed, step, op, answers)
        assert fast.state() == plain.state(), (seed, step, op)
        fast.bm.check()
    for side in (fast, plain):
        for j in list(side.jobs):
            side.bm.release(j)
    assert fast.state() == plain.state()
    assert fast.bm.device.num_free == device and fast.bm.host.num_free == host
    return {
        "copied in": sum(1 for d, _, _ in fast.copies if d == "in"),
        "moved down": sum(1 for d, _, _ in fast.copies if d == "out"),
        "host evictions": fast.bm.host.evictions,
    }


@pytest.mark.parametrize("first", range(0, 400, 100))
def test_the_fast_cache_decides_exactly_as_the_plain_one(first):
    done = Counter[str]()
    for seed in range(first, first + 100):
        done.update(replay(seed, 300))
    # the traffic did what the comparison is for: copies back, demotions, evictions
    assert min(done.values()) > 100, done


def test_a_job_given_back_copied_nothing_and_its_held_run_goes_back_tail_first():
    # r's prefix: u1 on the device, u2 only on the host, u3 and u4 on the device and
    # idle. Attached, r holds the run from u2 on for its first growth; given back
    # (it did not run), nothing was copied and u4, u3 are the newest in the LRU
    sides = [Side(BlockManager(6, 1, 4)), Side(ReferenceBlockManager(6, 1, 4))]
    for side in sides:
        bm = side.bm
        bm.prefix.worth_copy = lambda n, start: True
        q, p = Job([1, 2], SP, job_id="q"), Job([1, 2, 3, 4], SP, job_id="p")
        run(bm, q)
        run(bm, p)  # computed, not attached: its u1, u2 blocks stay unnamed
        bm.release(q)
        bm.release(p)
        run(bm, Job([7, 8, 9], SP, job_id="f"))  # evicts q's u2 block: to the host
        r = Job([1, 2, 3, 4, 5], SP, job_id="r")
        side.jobs.append(r)
        before = list(side.copies)
        assert bm.prefix.plan(r) == (4, 1)  # four tokens reused, one block held now
        assert bm.attach(r) == 4 and len(r.block_table) == 1
        bm.detach(r)
        assert side.copies == before
    assert sides[0].state() == sides[1].state()
    assert sides[0].bm.device.idle_ids()[-2:] == [5, 4]  # p's u4, u3 blocks


def test_a_held_run_comes_back_into_the_blocks_of_the_first_growth():
    sides = [Side(BlockManager(6, 1, 4)), Side(ReferenceBlockManager(6, 1, 4))]
    for side in sides:
        bm = side.bm
        bm.prefix.worth_copy = lambda n, start: True
        q = Job([1, 2, 3], SP, job_id="q")
        run(bm, q)
        bm.release(q)
        f = Job([7, 8, 9, 6, 5, 4], SP, job_id="f")
        run(bm, f)  # every device block: q's go to the host
        bm.release(f)
        r = Job([1, 2, 3, 4], SP, job_id="r")
        side.jobs.append(r)
        before = len(side.copies)
        assert bm.attach(r) == 3 and r.block_table == []
        assert len(side.copies) == before  # nothing yet
        bm.append(r)  # its first growth (f's blocks evicted): the held blocks come back
        made = side.copies[before:]
        assert [d for d, _, _ in made] == ["out"] * (len(made) - 3) + ["in"] * 3
        assert [dst[0] for _, _, dst in made[-3:]] == r.block_table[:3]
        bm.check()
    assert sides[0].state() == sides[1].state()


def test_a_waiting_job_finds_a_prefix_renamed_after_its_last_lookup():
    # a's blocks are evicted (host 0: gone, names forgotten), then computed again
    # by c under new names; b, waiting since before, must find the new ones
    bm = BlockManager(4, 2, 0)
    bm.prefix.sink = lambda op: None
    a = Job([1, 2, 3, 4], SP, job_id="a")
    b = Job([1, 2, 3, 4, 7], SP, job_id="b")
    run(bm, a)
    bm.release(a)
    assert bm.prefix.peek(b) == 4  # remembered: both of a's names
    filler = Job([9] * 8, SP, job_id="f")
    run(bm, filler)  # takes every block: a's go, and their names with them
    assert bm.prefix.peek(b) == 0
    bm.release(filler)
    c = Job([1, 2, 3, 4, 5], SP, job_id="c")
    run(bm, c)
    assert bm.prefix.peek(b) == 4
    assert bm.attach(b) == 4 and b.block_table == c.block_table[:2]
