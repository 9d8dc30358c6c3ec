"""The prefix cache's block accounting (fsd.kv.prefix): reuse, copy on write, the two
tiers, eviction, and a shadow memory that every copy and step is replayed on.

The shadow memory holds, for each physical block, the tokens each slot's KV was
computed from (a position's KV depends on every token up to it). Every copy the cache or a swap issues is applied to it in issue
order, and a step writes its job's tokens into its table; after each operation
every job's table must read back exactly its own tokens. That catches a block
freed or overwritten while referenced, a cached name that aliases another token
sequence, and a copy on write that writes a shared block.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsd.jobs import Job, KVLocation, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.kv.prefix import ROOT
from fsd.kv.swap import SwapOp

BS = 4
_ids = itertools.count()


def job(tokens: list[int]) -> Job:
    return Job(list(tokens), SamplingParams(max_tokens=8), job_id=f"p{next(_ids)}")


class Shadow:
    """What each physical block holds, replayed from the copies and steps."""

    def __init__(self, bm: BlockManager) -> None:
        self.bm = bm
        self.device: dict[int, list[tuple[int, ...] | None]] = {}
        self.host: dict[int, list[tuple[int, ...] | None]] = {}
        bm.prefix.sink = self.copy

    def copy(self, op: SwapOp) -> None:
        src, dst = {
            "out": (self.device, self.host),
            "in": (self.host, self.device),
            "copy": (self.device, self.device),
        }[op.direction]
        for s, d in zip(op.src, op.dst, strict=True):
            dst[d] = list(src.get(s, [None] * BS))

    def step(self, j: Job) -> None:
        """Run the job's next step: compute every token it has not, into its table."""
        self.bm.append(j)
        toks = j.all_token_ids
        for t in range(j.num_computed_tokens, j.num_tokens):
            block = self.device.setdefault(j.block_table[t // BS], [None] * BS)
            block[t % BS] = tuple(toks[: t + 1])
        j.num_computed_tokens = j.num_tokens
        self.bm.prefix.commit(j, j.block_table)

    def swap(self, j: Job, direction: str) -> None:
        op = self.bm.swap_out(j, sync=True) if direction == "out" else self.bm.swap_in(j, sync=True)
        self.copy(op)

    def verify(self, jobs: list[Job]) -> None:
        self.bm.check()
        for j in jobs:
            if j.kv is KVLocation.DEVICE:
                table, memory = j.block_table, self.device
            elif j.kv is KVLocation.HOST:
                table, memory = j.host_block_table, self.host
            else:
                continue
            toks = j.all_token_ids
            for t in range(j.num_computed_tokens):
                assert memory[table[t // BS]][t % BS] == tuple(toks[: t + 1]), (j.job_id, t)
        # a named block holds exactly the tokens its name stands for
        for where, pool, memory in (
            (self.bm.prefix.on_device, self.bm.device, self.device),
            (self.bm.prefix.on_host, self.bm.host, self.host),
        ):
            for uid, block in where.items():
                assert pool.cached[block] == uid
                prefix = self._prefix(uid)
                if prefix is not None:  # (None: a forgotten parent, unreachable)
                    n = len(prefix) - BS
                    assert memory[block] == [prefix[: n + s + 1] for s in range(BS)], uid

    def _prefix(self, uid: int) -> tuple[int, ...] | None:
        """The tokens a name stands for: its chain of contents back to the root."""
        keys, parts = self.bm.prefix._key, []
        while uid != ROOT:
            if uid not in keys:
                return None
            uid, content = keys[uid]
            parts.append(content)
        return tuple(t for c in reversed(parts) for t in c)


def manager(device: int, host: int) -> tuple[BlockManager, Shadow]:
    bm = BlockManager(device, BS, host)
    return bm, Shadow(bm)


def test_a_second_prompt_reuses_every_full_block_of_the_first_and_computes_the_rest():
    bm, mem = manager(16, 0)
    a, b = job(list(range(1, 11))), job(list(range(1, 9)) + [50, 51, 52])
    assert bm.attach(a) == 0
    mem.step(a)
    assert bm.prefix.peek(b) == 8
    assert bm.attach(b) == 8  # blocks [1..4] and [5..8]; the third differs
    assert b.block_table == a.block_table[:2] and b.num_cached_tokens == 8
    mem.step(b)
    mem.verify([a, b])
    assert [bm.device.refs(x) for x in a.block_table] == [2, 2, 1]


def test_a_whole_cached_prompt_computes_its_last_token_in_a_copy_of_its_last_block():
    bm, mem = manager(16, 0)
    a, b = job(list(range(1, 9))), job(list(range(1, 9)))
    bm.attach(a)
    mem.step(a)
    copies: list[SwapOp] = []
    bm.prefix.sink = lambda op: (copies.append(op), mem.copy(op))
    assert bm.attach(b) == 7  # the last token runs again, for its logits
    assert [op.direction for op in copies] == ["copy"]
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]
    mem.step(b)
    mem.verify([a, b])


@pytest.mark.parametrize("shared", [0, 1, 3, 4, 5, 12])
def test_reuse_is_the_shared_prefix_rounded_down_to_whole_blocks(shared):
    bm, mem = manager(32, 0)
    base = list(range(100, 113))  # 13 tokens
    other = base[:shared] + [7] * (13 - shared)
    a, b = job(base), job(other)
    bm.attach(a)
    mem.step(a)
    assert bm.attach(b) == min(shared // BS * BS, 12)
    mem.step(b)
    mem.verify([a, b])


def test_evicted_blocks_move_to_the_host_and_come_back_by_copy():
    bm, mem = manager(4, 8)
    a = job(list(range(1, 9)))  # two full blocks, plus one for its next token
    bm.attach(a)
    mem.step(a)
    bm.release(a)
    assert bm.device.num_idle == 2 and bm.device.num_free == 4
    filler = job(list(range(200, 216)))  # takes every device block: the idle ones go down
    mem.step(filler)
    assert bm.prefix.stats().host_blocks == 2 and bm.prefix.stats().device_evictions == 2
    bm.release(filler)
    b = job(list(range(1, 9)) + [9])
    assert bm.attach(b) == 8
    assert bm.prefix.stats().host_hits == 8
    mem.step(b)
    mem.verify([b])


def test_the_host_keeps_the_leading_block_when_it_has_room_for_one():
    bm, mem = manager(3, 1)
    a = job(list(range(1, 9)))
    bm.attach(a)
    mem.step(a)
    bm.release(a)  # tail first in line: the second block is evicted before the first
    mem.step(job(list(range(300, 312))))  # three blocks: both of a's are evicted
    stats = bm.prefix.stats()
    assert stats.host_blocks == 1 and stats.host_evictions == 1  # the tail, gone for good
    bm.release(next(iter(bm.on_device.values())))  # type: ignore[arg-type]
    b = job(list(range(1, 9)) + [9])
    assert bm.attach(b) == 4  # the leading block, from the host; the second is recomputed
    mem.step(b)
    mem.verify([b])


def test_a_referenced_block_is_never_evicted_and_a_swapped_out_job_keeps_its_kv():
    bm, mem = manager(6, 8)
    a, b = job(list(range(1, 13))), job(list(range(1, 13)) + [40])
    bm.attach(a)
    mem.step(a)
    bm.attach(b)
    mem.step(b)  # shares a's three blocks
    mem.swap(a, "out")  # a's copies go to the host; b still holds the shared blocks
    mem.verify([a, b])
    assert all(bm.device.refs(x) >= 1 for x in b.block_table)
    with pytest.raises(MemoryError):
        bm.device.take(bm.device.num_free + 1)
    mem.swap(a, "in")
    mem.verify([a, b])


def test_detach_gives_back_exactly_what_attach_took():
    bm, mem = manager(8, 0)
    a, b = job(list(range(1, 10))), job(list(range(1, 10)))
    bm.attach(a)
    mem.step(a)
    refs = [bm.device.refs(x) for x in a.block_table]
    before = bm.prefix.stats()
    bm.attach(b)
    bm.detach(b)
    assert [bm.device.refs(x) for x in a.block_table] == refs
    assert b.block_table == [] and b.num_computed_tokens == 0 and b.num_cached_tokens == 0
    after = bm.prefix.stats()
    assert (after.queries, after.hits, after.host_hits) == (before.queries, before.hits, 0)
    # the interval counts only grow: a rate over an interval that holds the detach but
    # not the attach never passes 100% (a stats line once read 483%)
    assert after.lookups == before.lookups + b.num_tokens and after.lookup_hits > before.lookup_hits
    mem.verify([a])


def test_turning_the_cache_off_forgets_idle_blocks_and_keeps_jobs_whole():
    bm, mem = manager(8, 4)
    a, b = job(list(range(1, 10))), job(list(range(1, 10)))
    bm.attach(a)
    mem.step(a)
    bm.attach(b)
    mem.step(b)
    bm.release(a)
    bm.prefix.clear()
    bm.prefix.enabled = False
    assert bm.prefix.stats().device_blocks == 0 and bm.device.num_idle == 0
    mem.verify([b])
    assert bm.attach(job(list(range(1, 10)))) == 0
    bm.release(b)
    assert bm.device.num_free == 8


# ---- property: random traffic over a small shared vocabulary ------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["new", "step", "grow", "release", "out", "in"]),
        st.integers(0, 7),
        st.lists(st.integers(1, 3), min_size=1, max_size=14),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, device=st.integers(4, 12), host=st.integers(0, 8))
def test_random_traffic_never_frees_a_referenced_block_or_aliases_a_name(ops, device, host):
    bm, mem = manager(device, host)
    jobs: list[Job] = []
    for op, k, tokens in ops:
        live = [j for j in jobs if j.job_id in bm._owners or j.kv is KVLocation.NONE]
        target = live[k % len(live)] if live else None
        if op == "new":
            j = job(tokens)
            jobs.append(j)
            bm.attach(j)
            if bm.missing(j) <= bm.device.num_free:
                mem.step(j)
            else:
                bm.detach(j)
        elif target is None:
            continue
        elif op in ("step", "grow") and target.kv is KVLocation.DEVICE:
            if op == "grow":
                target.output_token_ids.append(tokens[0])
            if bm.missing(target) <= bm.device.num_free:
                mem.step(target)
            elif op == "grow":
                target.output_token_ids.pop()
        elif op == "release":
            bm.release(target)
            jobs.remove(target)
        elif op == "out" and target.kv is KVLocation.DEVICE and bm.can_swap_out(target):
            mem.swap(target, "out")
        elif op == "in" and target.kv is KVLocation.HOST and bm.can_swap_in(target):
            mem.swap(target, "in")
        mem.verify(jobs)
    for j in jobs:
        bm.release(j)
    bm.check()
    assert bm.device.num_free == device and bm.host.num_free == host
