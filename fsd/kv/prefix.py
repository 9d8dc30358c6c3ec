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
device block when `worth_copy` says the copy beats recomputing them. The copies wait
for the job's first growth (`complete`), which takes the fresh blocks with the rest:
a job the walk attaches and then cannot run copies nothing and evicts nothing. A job
whose whole sequence is cached still computes its last token (for its logits): its
last block is copied first (copy on write), so no shared block is ever written.

A router far away learns each name stored or removed from `events` (fsd.kv.prefix_events).

Every copy the cache makes is synchronous: it is handed to `sink` in the order it
was decided, among the scheduler's own synchronous copies, so a block is read
before anything later in the iteration writes it.

Cost: the walk attaches a waiting job only once it gets a step and room to grow
(`plan` says what attach would give, taking nothing), and a long context has
thousands of blocks, so the per-block paths are written for speed: a waiting job's
chain of names is remembered between lookups (`_chains`: re-read only from the first
name no longer held), and the pool steps of `attach` and an eviction are the pool's
own (`take`, `ref`, `give`) inlined, with the same effects; tests/kv/test_prefix_fast.py
and tests/sim/test_prefix_sim_fast.py hold them to tests/kv/prefix_reference.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import Any

from fsd.kv.pool import BlockPool
from fsd.kv.prefix_events import DEVICE, HOST, BlockEvents
from fsd.kv.prefix_types import AttachPlan, HasPrefix, counters, nowhere
from fsd.kv.swap import SwapOp
from fsd.protocol_telemetry import PrefixInfo

ROOT = 0  # the parent of a sequence's first block


def undo_counts(cache: Any, job: HasPrefix) -> None:
    """What `attach` counted for a job that did not run after all, taken back."""
    hit, host_hit = cache._attached.pop(job.job_id, (0, 0))
    cache.queries -= job.num_tokens
    cache.hits -= hit
    cache.host_hits -= host_hit
    if hit and job.num_cached_tokens == hit:
        job.num_cached_tokens = 0


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
        self.sink: Callable[[SwapOp], None] = nowhere
        # whether copying n host blocks beats recomputing them after `start` tokens
        self.worth_copy: Callable[[int, int], bool] = lambda n, start: True
        self.queries = self.hits = self.host_hits = self.lookups = self.lookup_hits = 0
        self._attached: dict[str, tuple[int, int]] = {}  # job -> (hit, host hit) to undo
        # a job without KV -> the names of its leading blocks as its last lookup found
        # them: each still held by a tier is the name a walk from the root would find
        # (a name is never reused), so a lookup re-derives only from the first one not
        # held; dropped when the job runs (`commit`: its tokens may change) or leaves
        self._chains: dict[str, list[int]] = {}
        # a job attached, not grown yet -> (its table's length, then the uids, blocks
        # and tiers of the run held for `complete`)
        self._pending: dict[str, tuple[int, list[int], list[int], list[bool]]] = {}
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

    def plan(self, job: HasPrefix) -> tuple[int, int]:
        """What `attach` would give the job now, without taking anything: the tokens
        reused, and the device blocks its table would start with (the rest of the
        reused blocks come with its first growth, `complete`)."""
        if not self.enabled or job.block_table or job.num_computed_tokens:
            return job.num_computed_tokens, len(job.block_table)
        p = self._plan(job)
        return p.computed, p.table_len

    def _plan(self, job: HasPrefix) -> AttachPlan:
        """attach's decision. The found run is cut at the first host block when copying
        the host blocks back would not beat recomputing them. A job whose whole sequence
        is found still computes its last token, in a copy of its last block (copy on
        write): made now for a device block while the device has a free one (else the
        block is recomputed), and by `complete` for a host run."""
        uids, blocks, on_dev = self._lookup(job)
        bs, found = self.block_size, len(blocks)
        first_host = on_dev.index(False) if False in on_dev else found
        if first_host < found and not self.worth_copy(on_dev.count(False), first_host * bs):
            found = first_host
            del uids[found:], blocks[found:], on_dev[found:]
        computed, table_len, cow = found * bs, first_host, False
        if found and computed >= job.num_tokens:  # the whole sequence is cached
            if first_host < found:
                computed = job.num_tokens - 1
            else:  # the copy on write needs a device block once the found ones are held
                held = sum(1 for b in blocks if self.device._refs[b] == 0)
                cow = self.device.num_free - held > 0
                computed = job.num_tokens - 1 if cow else (found - 1) * bs
                table_len = found if cow else found - 1
        return AttachPlan(uids, blocks, on_dev, first_host, computed, table_len, cow)

    def attach(self, job: HasPrefix) -> int:
        """Give a job without KV the cached blocks of its prefix; returns the tokens
        reused (its `num_computed_tokens`). The leading device run is referenced now;
        the rest (from the first host block) is held and comes back by copy into the
        blocks of the job's first growth (`complete`), so a job that does not run after
        all (`detach`) has copied nothing."""
        if not self.enabled or job.block_table or job.num_computed_tokens:
            return 0
        p = self._plan(job)
        uids, blocks, on_dev, first = p.uids, p.blocks, p.on_dev, p.first_host
        self._pin(blocks, on_dev)
        bs, table = self.block_size, blocks[:first]
        if first < len(blocks):
            self._pending[job.job_id] = (first, uids[first:], blocks[first:], on_dev[first:])
        elif p.cow:  # copy on write: the last token is computed in a copy of its block
            last = table.pop()
            dst = self.device.take(1)[0]
            self.sink(SwapOp(None, "copy", [last], [dst], True))
            table.append(dst)
            self.device.give((last,))
        elif len(table) > p.table_len:  # no room for the copy: the last block is recomputed
            self.device.give((table.pop(),))
        job.block_table[:] = table
        del uids[len(blocks) if first < len(blocks) else p.table_len :]
        job.prefix_uids[:] = uids
        job.num_computed_tokens = computed = p.computed
        host_hit = bs * on_dev.count(False)
        self.queries += job.num_tokens
        self.hits += computed
        self.host_hits += host_hit
        self.lookups, self.lookup_hits = self.lookups + job.num_tokens, self.lookup_hits + computed
        self._attached[job.job_id] = (computed, host_hit)
        if computed and not job.num_cached_tokens and not job.num_output_tokens:
            job.num_cached_tokens = min(computed, job.num_prompt_tokens)  # its first prefill
        return computed

    def _pin(self, blocks: list[int], on_dev: list[bool]) -> None:
        """One more reference to each block found (`BlockPool.ref`), so that no eviction
        takes one of them before the job holds or gives it back."""
        d_refs, d_idle = self.device._refs, self.device._idle
        h_refs, h_idle = self.host._refs, self.host._idle
        for block, dev in zip(blocks, on_dev, strict=True):
            refs, idle = (d_refs, d_idle) if dev else (h_refs, h_idle)
            if refs[block] == 0:
                del idle[block]
            refs[block] += 1

    def complete(self, job: HasPrefix) -> None:
        """The job grew (its table holds a block for each reused one): the held run
        comes back, each block copied into its place (host blocks in one `in`, device
        ones found past the first host block in one `copy`) and named there, then given
        back."""
        pending = self._pending.pop(job.job_id, None)
        if pending is None:
            return
        first, uids, blocks, on_dev = pending
        table, sink = job.block_table, self.sink
        on_device, d_cached, keys = self.on_device, self.device.cached, self._key
        named = len(blocks)  # the last block of a whole sequence: its last token writes it
        if (first + named) * self.block_size >= job.num_tokens:
            named -= 1
        moves: dict[bool, tuple[list[int], list[int]]] = {False: ([], []), True: ([], [])}
        for k, (uid, src, dev) in enumerate(zip(uids, blocks, on_dev, strict=True)):
            dst = table[first + k]
            moves[dev][0].append(src)
            moves[dev][1].append(dst)
            if k < named and uid not in on_device and dst not in d_cached and uid in keys:
                on_device[uid] = dst
                d_cached[dst] = uid
                if self.events is not None:
                    self.events.stored(uid, DEVICE)
        for dev, (src_, dst_) in moves.items():  # one copy per direction (distinct blocks)
            if src_:
                sink(SwapOp(None, "copy" if dev else "in", src_, dst_, True))
        self._give_held(blocks, on_dev)

    def _give_held(self, blocks: list[int], on_dev: list[bool]) -> None:
        """Give back a held run, tail first (the least shareable part is evicted first)."""
        pairs = list(zip(blocks, on_dev, strict=True))[::-1]
        self.device.give([b for b, dev in pairs if dev])
        self.host.give([b for b, dev in pairs if not dev])

    def detach(self, job: HasPrefix) -> None:
        """Undo `attach` for a job that did not run after all (counters included)."""
        pending = self._pending.pop(job.job_id, None)
        self.device.give(reversed(job.block_table))
        if pending is not None:
            self._give_held(pending[2], pending[3])
        job.block_table.clear()
        job.table_epoch += 1
        job.num_computed_tokens = 0
        undo_counts(self, job)

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
        n = len(uids)
        if not moved and n >= job.num_computed_tokens // bs and (not n or uids[-1] in self._key):
            return  # no block completed since the last call (a decode: 1 step in bs)
        full = min(job.num_computed_tokens // bs, len(table))
        start = 0 if moved else n
        if uids and uids[-1] not in self._key:  # a name forgotten meanwhile: re-derive
            uids.clear()
            start = 0
        pool, where = (self.device, self.on_device) if on_device else (self.host, self.on_host)
        cached, keys, known, ev = pool.cached, self._key, len(uids), self.events
        tier = DEVICE if on_device else HOST
        stop = min(known, full)  # a new table (a move ended): the names known, on it
        if start < stop:  # (uids and blocks are distinct: each pair is decided alone)
            pairs = zip(uids[start:stop], table[start:stop], strict=True)
            new = [(u, b) for u, b in pairs if u not in where and b not in cached and u in keys]
            where.update(new)
            cached.update((b, u) for u, b in new)
            if ev is not None:
                for uid, _ in new:
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

    def _demote(self, evicted: list[tuple[int, int]]) -> None:
        """Device blocks evicted (block, uid): each one's content moves to the host
        unless there already, in one copy."""
        on_device, on_host, host, ev = self.on_device, self.on_host, self.host, self.events
        free, idle, h_cached = host._free, host._idle, host.cached
        src: list[int] = []
        dst: list[int] = []
        for block, uid in evicted:
            on_device.pop(uid, None)
            if ev is not None:
                ev.removed(uid, DEVICE)
            if uid in on_host:
                continue  # (the host holds it: its name stays)
            if not free and not idle:
                self._forget(uid)
                continue
            # `host.take(1)`, `mark` and `give`: the block ends idle (unreferenced), newest
            if free:
                to = free.popleft()
            else:  # its eviction: `_drop_host`, inlined
                to = idle.popitem(last=False)[0]
                host.evictions += 1
                self._drop_one(h_cached.pop(to))
            src.append(block)
            dst.append(to)
            on_host[uid] = to
            h_cached[to] = uid
            idle[to] = None
            if ev is not None:
                ev.stored(uid, HOST)
        if src:
            self.sink(SwapOp(None, "out", src, dst, True))

    def _drop_host(self, evicted: list[tuple[int, int]]) -> None:
        """Host blocks evicted: their contents are gone (forgotten unless on the device)."""
        for _, uid in evicted:
            self._drop_one(uid)

    def _drop_one(self, uid: int) -> None:
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
