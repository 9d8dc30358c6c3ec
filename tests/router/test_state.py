"""A replica's pushed state: the prefix cache's block events by content name, the
builder's sequence numbers and resyncs, the router's index of each replica, and the
queued work per level (fsd.kv.prefix_events, fsd.router.state, .index, .view, .work)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from fsd.config import CacheConfig, SchedConfig
from fsd.jobs import Job, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.kv.prefix_events import DEVICE, HOST, REMOVED, STORED, BlockEvents, chain_names, watch
from fsd.router.index import PrefixIndex
from fsd.router.router import prompt_names
from fsd.router.state import ReplicaState, StateBuilder
from fsd.router.work import contribution, level_starts, queued_work
from fsd.sched.registry import make_scheduler
from tests.router.helpers import COST, cached, request, router, state

BS = 4
_ids = itertools.count()


def job(tokens: list[int]) -> Job:
    return Job(list(tokens), SamplingParams(max_tokens=8), job_id=f"j{next(_ids)}")


def run(bm: BlockManager, j: Job) -> None:
    """Compute the job's tokens into fresh blocks and name them (a step)."""
    bm.prefix.sink = lambda op: None
    bm.append(j)
    j.num_computed_tokens = j.num_tokens
    bm.prefix.commit(j, j.block_table)


def test_a_block_is_named_by_its_content_the_same_on_every_replica():
    tokens = list(range(10))  # two full blocks of 4, and 2 tokens
    names = prompt_names(tokens, BS)
    assert names == tuple(chain_names([(0, 1, 2, 3), (4, 5, 6, 7)]))
    seen = []
    uids = []
    for replica in range(2):  # two replicas cache the same prompt under different uids
        bm = BlockManager(16, BS, 16)
        if replica:
            run(bm, job([99] * 8))  # takes uids 1 and 2 on this replica
        events = watch(bm.prefix)
        events.drain()  # the first read after watching is a snapshot
        j = job(tokens)
        run(bm, j)
        seen.append(events.drain())
        uids.append(j.prefix_uids)
    assert uids[0] != uids[1]
    assert seen[0] == seen[1] == [(STORED, DEVICE, n) for n in names]


def test_events_follow_a_block_down_to_the_host_and_out():
    bm = BlockManager(4, BS, 2)  # 4 device blocks, 2 host blocks
    events = watch(bm.prefix)
    events.drain()
    a = job(list(range(8)))  # 2 blocks
    run(bm, a)
    bm.free(a)  # idle on the device, still cached
    names = prompt_names(list(range(8)), BS)
    assert events.drain() == [(STORED, DEVICE, n) for n in names]
    run(bm, job(list(range(100, 116))))  # 4 new blocks: a's two are evicted to the host
    log = events.drain()
    assert log is not None
    moved = [e for e in log if e[2] in names]
    assert moved == [(REMOVED, DEVICE, names[1]), (STORED, HOST, names[1]),
                     (REMOVED, DEVICE, names[0]), (STORED, HOST, names[0])]  # fmt: skip
    held = {(t, n) for _, t, n in events.snapshot()}
    assert (HOST, names[0]) in held and (DEVICE, names[0]) not in held
    bm.prefix.clear()
    assert events.drain() is None and events.snapshot() == []


def test_the_log_is_bounded_and_an_overflow_asks_for_a_snapshot():
    bm = BlockManager(64, BS, 0)
    events = watch(bm.prefix, limit=3)
    assert events.drain() is None  # first read: a snapshot
    run(bm, job(list(range(40))))  # 10 blocks: past the limit
    assert events.drain() is None
    assert len(events.snapshot()) == 10
    run(bm, job(list(range(200, 208))))
    assert len(events.drain() or []) == 2  # logging again after the read


def test_a_name_survives_its_parent_being_forgotten():
    keys = {1: (0, "a"), 2: (1, "b")}
    ev = BlockEvents(keys)
    ev.stored(2, HOST)  # derived through uid 1, which no tier holds
    assert ev.name_of(2) == chain_names(["a", "b"])[1]
    del keys[1], keys[2]
    ev.removed(2, HOST)
    assert ev.snapshot() == []
    orphan = BlockEvents({3: (7, "c")})  # parent 7 was forgotten: a name matching nothing
    assert orphan.name_of(3) not in chain_names(["c"])


def builder_and_scheduler(device: int = 64, host: int = 64) -> tuple[StateBuilder, object]:
    bm = BlockManager(device, BS, host)
    sched = make_scheduler(SchedConfig(), CacheConfig(block_size=BS), bm, COST)
    return StateBuilder(3, bm), sched


def test_the_builder_numbers_its_states_and_sends_a_full_one_first_and_on_resync():
    builder, sched = builder_and_scheduler()
    first = builder.build(sched, 0.0, 0)
    assert (first.replica, first.seq, first.full, first.events) == (3, 1, True, ())
    run(builder.blocks, job(list(range(8))))
    second = builder.build(sched, 1.0, 0)
    assert (second.seq, second.full, len(second.events)) == (2, False, 2)
    builder.resync()
    third = builder.build(sched, 2.0, 0)
    assert third.seq == 3 and third.full and len(third.events) == 2
    assert ReplicaState.from_dict(third.to_dict()) == third


def test_a_lost_push_makes_the_router_ask_for_a_resync_and_the_full_state_repairs_it():
    builder, sched = builder_and_scheduler()
    r = router("cache-aware", replicas=4)
    assert not r.update(builder.build(sched, 0.0, 0))  # seq 1, full
    view = r.views[3]
    a = job(list(range(8)))
    run(builder.blocks, a)
    lost = builder.build(sched, 1.0, 0)  # seq 2: never reaches the router
    assert lost.events
    run(builder.blocks, job(list(range(50, 58))))
    assert r.update(builder.build(sched, 2.0, 0))  # seq 3 after 1: resync
    assert r.resyncs == 1 and view.stale
    names_a = prompt_names(a.prompt_token_ids, BS)
    assert view.match(names_a) == (0, 0)  # what seq 2 said is missing
    builder.resync()
    assert not r.update(builder.build(sched, 3.0, 0))  # full: repaired
    assert view.match(names_a) == (2, 0) and not view.stale
    assert r.resyncs == 1
    # a late push older than the one applied is ignored
    assert not r.update(lost)


def test_the_index_applies_stores_and_removals_and_a_full_state_replaces_it():
    idx = PrefixIndex()
    names = chain_names(["a", "b", "c"])
    assert idx.apply(cached(tuple(names)), False, 100)
    assert idx.match(names) == (3, 0)
    idx.apply([(REMOVED, DEVICE, names[1]), (STORED, HOST, names[1])], False, 100)
    assert idx.match(names) == (3, 1)
    idx.apply([(REMOVED, HOST, names[1])], False, 100)
    assert idx.match(names) == (1, 0)  # the chain breaks at the missing block
    idx.apply(cached(tuple(names[:1]), HOST), True, 100)  # a resync: only this is cached
    assert idx.match(names) == (1, 1) and len(idx) == 1
    # more names than the replica has blocks (and slack): drifted, emptied, resync
    many = cached(tuple(chain_names(range(2000))))
    assert not idx.apply(many, False, 10) and len(idx) == 0


def test_pending_names_count_as_cached_until_acknowledged():
    names = tuple(chain_names(["x", "y"]))
    r = router("cache-aware")
    r.update(state(0))
    r.update(state(1))
    first = r.choose(request(0, 32, names)).replica
    assert r.views[first].match(names) == (2, 0)
    r.update(state(first, seq=2, admitted=1))  # counted: the pending names go
    assert r.views[first].match(names) == (0, 0)


def test_work_ahead_follows_skip_join():
    starts = level_starts((1.0, 2.0, 4.0))  # P = 0, 1, 3, 7
    # a job at level 0 with 0.5 s attained and 10 s of decode left: at its own level it
    # runs out its quantum (0.5 s), ahead of level 1 until it reaches it (0.5), of level
    # 2 until it reaches level 2 (2.5)
    assert contribution(0, 0.5, 0.0, 10.0, starts) == [(0, 0.5), (1, 0.5), (2, 2.5)]
    # expected to need 1 s only: capped from level 1 on, a prefill ahead of everything
    assert contribution(0, 0.0, 0.2, 1.0, starts) == [(0, 1.2)]
    assert contribution(2, 0.0, 0.0, math.inf, starts) == [(2, 4.0)]


def test_the_state_holds_each_levels_jobs_and_the_work_ahead():
    builder, sched = builder_and_scheduler(device=256)
    jobs = [job([7] * n) for n in (8, 8, 200)]
    for j in jobs:
        sched.add(j, 0.0)
    st = builder.build(sched, 0.0, 3)
    levels = [j.level for j in jobs]
    assert sum(st.jobs) == 3 and st.waiting == 3 and st.running == 0 and st.admitted == 3
    assert st.jobs[levels[2]] == 1 and levels[2] > levels[0]
    assert st.ahead == tuple(sorted(st.ahead))  # lower levels wait behind more
    assert st.ahead[levels[0]] > 0 and st.ahead[0] <= st.ahead[-1]
    assert st.work[levels[0]] > 0 and st.quanta == tuple(sched.queue.quanta)
    assert queued_work(sched).ahead == st.ahead


def test_a_queue_without_levels_is_one_level_of_everything_queued():
    bm = BlockManager(64, BS, 0)
    sched = make_scheduler(SchedConfig(policy="fcfs"), CacheConfig(block_size=BS), bm, COST)
    for n in (8, 12):
        sched.add(job([1] * n), 0.0)
    w = queued_work(sched)
    assert w.quanta == (math.inf,) and w.jobs == (2,)
    assert w.ahead[0] == pytest.approx(w.work[0]) and w.ahead[0] > 0


def true_names(bm: BlockManager, events: BlockEvents) -> dict[int, int]:
    """What the cache holds now, by content name: each uid's chain derived from the
    cache's own keys (the events' remembered name where a parent was forgotten)."""
    p = bm.prefix
    held: dict[int, int] = {}
    for tier, where in ((DEVICE, p.on_device), (HOST, p.on_host)):
        for uid in where:
            contents, u = [], uid
            while u in p._key:
                parent, content = p._key[u]
                contents.append(content)
                u = parent
            name = chain_names(reversed(contents))[-1] if u == 0 else events.name_of(uid)
            assert name == events.name_of(uid)
            held[name] = held.get(name, 0) | tier
    return held


@pytest.mark.parametrize("seed", range(40))
def test_the_index_fed_by_events_is_what_the_cache_holds_under_random_traffic(seed):
    """The prefix cache's own random traffic (tests/kv/test_prefix_fast.py), the events
    drained into an index after every step (a push each step), or every few steps
    through a small log that overflows (then a full state)."""
    from tests.kv.test_prefix_fast import OPS, Side, apply

    rng = random.Random(seed)
    device, host, bs = rng.randint(4, 24), rng.randint(0, 16), rng.choice([1, 2, 4])
    sim = rng.random() < 0.5
    side = Side(BlockManager(device, bs, host))
    events = watch(side.bm.prefix, limit=rng.choice([8, 1 << 16]))
    idx = PrefixIndex()
    every = rng.choice([1, 5])
    for step in range(300):
        op = "toggle" if rng.random() < 0.01 else rng.choice(OPS)
        k, flag = rng.randint(0, 11), rng.random() < 0.5
        arg = [rng.randint(1, 4) for _ in range(rng.randint(1, 10))]
        apply(side, op, k, arg, flag, bs, sim)
        if step % every:
            continue
        log = events.drain()
        idx.apply(events.snapshot() if log is None else log, log is None, device + host)
        assert idx.tiers == true_names(side.bm, events), (seed, step, op)
