"""Prefix cache over the device and host tiers (no torch: engine and simulator).

Naming: a full block's content is named by a uid interned from (parent's uid, its
own content), so two blocks share a name exactly when their whole prefixes are
equal. Why not a hash: dict lookup compares the content itself, so names never
alias different token sequences, and the chain stays O(1) per block. The engine's
content is a block's token ids; the simulator's is a trace's prefix-block hash
(fsd.sim.job). A uid is forgotten when no tier holds its content any more.

Tiers: each uid is cached in at most one block per tier. A job's computed full
blocks are named after each iteration (`commit`: a block takes a uid's name unless
its tier holds that uid already, the block holds another, or the uid was forgotten
meanwhile; a copy back from the host is named by the same rule); when a job ends or
leaves a tier its named blocks stay there, idle, until the pool needs them (LRU,
tail blocks first). A device block evicted is first copied to the host tier when
the host lacks it; a host block evicted is gone. A new job (`attach`) reuses every
leading block found: device blocks by reference, host blocks by a copy into a fresh
device block when `worth_copy` says the copy beats recomputing them. A job whose
whole sequence is cached still computes its last token (for its logits): its last
block is copied first (copy on write), so no shared block is ever written.

A router far away learns each name stored or removed from `events` (fsd.kv.prefix_events).

Every copy the cache makes is synchronous: it is handed to `sink` in the order it
was decided, among the scheduler's own synchronous copies, so a block is read
before anything later in the iteration writes it.

Cost: the scheduler attaches a waiting job (and detaches it when it does not run
after all) at every iteration it is considered, and a long context has thousands
of blocks, so the per-block paths are written for speed: a waiting job's chain of
names is remembered between lookups (`_chains`: re-read only from the first name no
longer held), and the per-block pool steps of `attach` and an eviction are the
pool's own (`BlockPool.take(1)`, `ref`, `give`) inlined, in the same order, with the
same effects; tests/kv/test_prefix_fast.py and tests/sim/test_prefix_sim_fast.py hold
them to the plain implementation (tests/kv/prefix_reference.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from fsd.kv.pool import BlockPool
from fsd.kv.prefix_events import DEVICE, HOST, BlockEvents
from fsd.kv.swap import SwapOp
from fsd.protocol_telemetry import PrefixInfo  # its counters as published: one struct

ROOT = 0  # the parent of a sequence's first block


class HasPrefix(Protocol):
    """What the prefix cache needs of a job."""

    job_id: str
    block_table: list[int]
    num_computed_tokens: int
    num_cached_tokens: int
    prefix_uids: list[int]
    table_epoch: int  # (fsd.kv.block_manager.HasBlocks)

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...

    def block_content(self, index: int, block_size: int) -> Hashable | None: ...


class PrefixCache:
    """Names full blocks, finds a job's cached prefix, and moves evicted blocks down."""

    def __init__(self, device: BlockPool, host: BlockPool, block_size: int) -> None:
        self.device = device
        self.host = host
        self.block_size = block_size
        self.enabled = True
        self._uid: dict[tuple[int, Hashable], int] = {}
        self._key: dict[int, tuple[int, Hashable]] = {}
        self._next = itertools.count(ROOT + 1)
        self.on_device: dict[int, int] = {}  # uid -> device block
        self.on_host: dict[int, int] = {}  # uid -> host block
        # where the cache's copies go (the scheduler points it at its output)
        self.sink: Callable[[SwapOp], None] = _nowhere
        # whether copying n host blocks beats recomputing them after `start` tokens
        self.worth_copy: Callable[[int, int], bool] = lambda n, start: True
        self.queries = self.hits = self.host_hits = self.lookups = self.lookup_hits = 0
        self._attached: dict[str, tuple[int, int]] = {}  # job -> (hit, host hit) to undo
        # a job without KV -> the names of its leading blocks as its last lookup found
        # them: each still held by a tier is the name a walk from the root would find
        # (a name is never reused), so a lookup re-derives only from the first one not
        # held; dropped when the job runs (`commit`: its tokens may change) or leaves
        self._chains: dict[str, list[int]] = {}
        self.events: BlockEvents | None = None  # a router's feed (fsd.kv.prefix_events.watch)
        device.on_evict = self._demote
        host.on_evict = self._drop_host

    # ---- names -----------------------------------------------------------------

    def _forget(self, uid: int) -> None:
        if uid not in self.on_device and uid not in self.on_host:
            key = self._key.pop(uid, None)
            if key is not None:
                del self._uid[key]

    def _lookup(self, job: HasPrefix) -> tuple[list[int], list[int], list[bool]]:
        """The leading full blocks found, in order: their uids, blocks, and whether
        each is on the device (else on the host)."""
        bs = self.block_size
        n = job.num_tokens // bs
        dev_get, host_get = self.on_device.get, self.on_host.get
        chain = self._chains.get(job.job_id, [])  # kept once it names a block (below)
        # the names remembered, while a tier holds them (each on the device, else host)
        known = chain if len(chain) <= n else chain[:n]
        devs = list(map(dev_get, known))
        if None not in devs:
            uids, blocks, on_dev = list(known), devs, [True] * len(known)
        else:
            blocks = list(map(dev_get, known, map(host_get, known)))
            if None in blocks:
                del blocks[blocks.index(None) :]
            uids, on_dev = known[: len(blocks)], [d is not None for d in devs[: len(blocks)]]
        i = len(blocks)
        if i < len(known) and known[i] in self._key:
            return uids, blocks, on_dev  # still its name, and no tier holds it: the end
        del chain[i:]  # past here, derived again from the contents
        uid_get, parent = self._uid.get, uids[-1] if uids else ROOT
        while i < n:
            content = job.block_content(i, bs)
            uid = None if content is None else uid_get((parent, content))
            if uid is None:
                break
            chain.append(uid)
            block = dev_get(uid)
            if block is None:
                block = host_get(uid)
                if block is None:
                    break
                on_dev.append(False)
            else:
                on_dev.append(True)
            uids.append(uid)
            blocks.append(block)
            parent = uid
            i += 1
        if chain and job.job_id not in self._chains:  # not one empty list a queued job
            self._chains[job.job_id] = chain
        return uids, blocks, on_dev

    def forget_job(self, job_id: str) -> None:
        """The job left (or lost its KV): drop what its lookups remembered."""
        self._chains.pop(job_id, None)

    def peek(self, job: HasPrefix) -> int:
        """Tokens `attach` would reuse now (ignoring room), without taking anything."""
        if not self.enabled:
            return 0
        found = len(self._lookup(job)[0])
        return min(found * self.block_size, max(job.num_tokens - 1, 0))

    def attach(self, job: HasPrefix) -> int:
        """Give a job without KV the cached blocks of its prefix; returns the tokens
        reused (its `num_computed_tokens`). Host blocks come back by copy."""
        if not self.enabled or job.block_table or job.num_computed_tokens:
            return 0
        uids, blocks, on_dev = self._lookup(job)
        bs, found = self.block_size, len(blocks)
        first_host = on_dev.index(False) if False in on_dev else found
        # copy the host run only if it beats recomputing it
        if first_host < found and not self.worth_copy(on_dev.count(False), first_host * bs):
            found = first_host
            del uids[found:], blocks[found:], on_dev[found:]
        self._pin(blocks, on_dev)
        copies = first_host < found  # host blocks to bring back
        table = self._copy_back(uids, blocks, on_dev, first_host) if copies else list(blocks)
        device = self.device
        computed = len(table) * bs
        if table and computed >= job.num_tokens:  # copy on write: the last token is computed
            last = table.pop()
            computed = len(table) * bs
            if device.num_free:
                dst = device.take(1)[0]
                self.sink(SwapOp(None, "copy", [last], [dst], True))
                table.append(dst)
                computed = job.num_tokens - 1
            device.give((last,))
        job.block_table[:] = table
        del uids[len(table) :]
        job.prefix_uids[:] = uids
        job.num_computed_tokens = computed
        host_hit = bs * on_dev[: len(table)].count(False)
        self.queries += job.num_tokens
        self.hits += computed
        self.host_hits += host_hit
        self.lookups, self.lookup_hits = self.lookups + job.num_tokens, self.lookup_hits + computed
        self._attached[job.job_id] = (computed, host_hit)
        if computed and not job.num_cached_tokens and not job.num_output_tokens:
            job.num_cached_tokens = min(computed, job.num_prompt_tokens)  # its first prefill
        return computed

    def _pin(self, blocks: list[int], on_dev: list[bool]) -> None:
        """One more reference to each block found (`BlockPool.ref`), so that the copies
        back from the host evict none of them."""
        d_refs, d_idle = self.device._refs, self.device._idle
        h_refs, h_idle = self.host._refs, self.host._idle
        for block, dev in zip(blocks, on_dev, strict=True):
            refs, idle = (d_refs, d_idle) if dev else (h_refs, h_idle)
            if refs[block] == 0:
                del idle[block]
            refs[block] += 1

    def _copy_back(
        self, uids: list[int], blocks: list[int], on_dev: list[bool], first_host: int
    ) -> list[int]:
        """The job's table: the device blocks found, and a fresh device block for each
        host block (copied there, and named) while the device has room; the pinned host
        blocks, and the device blocks past the first copy without room, are given back."""
        device, host = self.device, self.host
        d_free, d_idle, d_refs, d_cached = device._free, device._idle, device._refs, device.cached
        sink, on_device, keys = self.sink, self.on_device, self._key
        table = blocks[:first_host]
        for k in range(first_host, len(blocks)):
            block = blocks[k]
            if on_dev[k]:
                table.append(block)
                continue
            if not d_free and not d_idle:
                break
            if d_free:  # `device.take(1)`
                dst = d_free.popleft()
            else:
                dst = d_idle.popitem(last=False)[0]
                evicted = d_cached.pop(dst)
                device.evictions += 1
                if device.on_evict is not None:
                    device.on_evict(dst, evicted)
            d_refs[dst] = 1
            sink(SwapOp(None, "in", [block], [dst], True))
            uid = uids[k]
            if uid not in on_device and dst not in d_cached and uid in keys:  # name it
                on_device[uid] = dst
                d_cached[dst] = uid
                if self.events is not None:
                    self.events.stored(uid, DEVICE)
            table.append(dst)
        host.give([b for b, dev in zip(blocks, on_dev, strict=True) if not dev])
        if len(table) < len(blocks):  # the device blocks past a copy there was no room for
            rest = zip(blocks[len(table) :], on_dev[len(table) :], strict=True)
            device.give([b for b, dev in rest if dev])
        return table

    def detach(self, job: HasPrefix) -> None:
        """Undo `attach` for a job that did not run after all (counters included)."""
        self.device.give(reversed(job.block_table))
        job.block_table.clear()
        job.table_epoch += 1
        job.num_computed_tokens = 0
        hit, host_hit = self._attached.pop(job.job_id, (0, 0))
        self.queries -= job.num_tokens
        self.hits -= hit
        self.host_hits -= host_hit
        if hit and job.num_cached_tokens == hit:
            job.num_cached_tokens = 0

    def commit(
        self, job: HasPrefix, table: list[int], on_device: bool = True, moved: bool = False
    ) -> None:
        """Name the job's computed full blocks in `table`: those computed since the last
        call, or all of them when the table is new (`moved`: a copy to the other tier
        ended, which is when its blocks hold the content)."""
        if not self.enabled:
            return
        if self._attached:  # it ran: what `attach` counted stays counted
            self._attached.pop(job.job_id, None)
        if self._chains:  # it ran: its tokens may differ from what its lookups read
            self._chains.pop(job.job_id, None)
        bs, uids = self.block_size, job.prefix_uids
        full = min(job.num_computed_tokens // bs, len(table))
        start = 0 if moved else len(uids)
        if uids and uids[-1] not in self._key:  # a name forgotten meanwhile: re-derive
            uids.clear()
            start = 0
        pool, where = (self.device, self.on_device) if on_device else (self.host, self.on_host)
        cached, keys, known, ev = pool.cached, self._key, len(uids), self.events
        tier = DEVICE if on_device else HOST
        stop = min(known, full)  # a new table (a move ended): the names known, on it
        if start < stop:
            for uid, block in zip(uids[start:stop], table[start:stop], strict=True):
                if uid not in where and block not in cached and uid in keys:  # name it
                    where[uid] = block
                    cached[block] = uid
                    if ev is not None:
                        ev.stored(uid, tier)
        if known >= full:
            return
        parent, names, count = uids[-1] if uids else ROOT, self._uid, self._next
        for i in range(known, full):  # the new ones: interned, and named
            content = job.block_content(i, bs)
            if content is None:
                break
            key = (parent, content)
            uid = names.get(key)
            if uid is None:
                uid = names[key] = next(count)
                keys[uid] = key
            uids.append(uid)
            parent = uid
            block = table[i]
            if uid not in where and block not in cached:
                where[uid] = block
                cached[block] = uid
                if ev is not None:
                    ev.stored(uid, tier)

    # ---- eviction ------------------------------------------------------------------

    def _demote(self, block: int, uid: int) -> None:
        """A device block is evicted: its content moves to the host unless there already."""
        self.on_device.pop(uid, None)
        if self.events is not None:
            self.events.removed(uid, DEVICE)
        on_host = self.on_host
        if uid in on_host:
            return  # (the host holds it: its name stays)
        host = self.host
        free, idle = host._free, host._idle
        if not free and not idle:
            self._forget(uid)
            return
        # `host.take(1)`, `mark` and `give`: the block ends idle (unreferenced), newest
        if free:
            dst = free.popleft()
        else:  # its eviction: `_drop_host`
            dst = idle.popitem(last=False)[0]
            gone = host.cached.pop(dst)
            host.evictions += 1
            self._drop_host(dst, gone)
        self.sink(SwapOp(None, "out", [block], [dst], True))
        on_host[uid] = dst
        host.cached[dst] = uid
        idle[dst] = None
        if self.events is not None:
            self.events.stored(uid, HOST)

    def _drop_host(self, block: int, uid: int) -> None:
        self.on_host.pop(uid, None)
        if self.events is not None:
            self.events.removed(uid, HOST)
        if uid not in self.on_device:  # no tier holds it: forgotten
            key = self._key.pop(uid, None)
            if key is not None:
                del self._uid[key]

    def clear(self) -> None:
        """Forget every cached block (idle ones become free; referenced ones stay)."""
        for pool, where in ((self.device, self.on_device), (self.host, self.on_host)):
            for block in list(where.values()):
                pool.unmark(block)
            where.clear()
        self._uid.clear()
        self._key.clear()
        self._chains.clear()
        if self.events is not None:
            self.events.reset()

    def stats(self) -> PrefixInfo:
        return counters(self)


def counters(cache: Any) -> PrefixInfo:
    """A prefix cache's counters as published (any cache with PrefixCache's fields)."""
    return PrefixInfo(
        enabled=cache.enabled, queries=cache.queries, hits=cache.hits,
        host_hits=cache.host_hits, device_blocks=len(cache.on_device),
        host_blocks=len(cache.on_host), device_evictions=cache.device.evictions,
        host_evictions=cache.host.evictions, lookups=cache.lookups, lookup_hits=cache.lookup_hits,
    )  # fmt: skip


def _nowhere(op: Any) -> None:
    raise RuntimeError("the prefix cache copied a block with no sink to run the copy")


class CopyBeatsRecompute:
    """`PrefixCache.worth_copy` on a cost model: copying a host run back beats
    recomputing it. A class, not a closure, so a scheduler pickles (fsd.twin)."""

    __slots__ = ("cost", "block_size")

    def __init__(self, cost: Any, block_size: int) -> None:  # cost: fsd.cost.CostModel
        self.cost, self.block_size = cost, block_size

    def __call__(self, n: int, start: int) -> bool:
        tokens = n * self.block_size
        return bool(self.cost.swap_time(tokens) < self.cost.chunk_time(tokens, start))
