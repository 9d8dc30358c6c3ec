"""The prefix cache and the block manager's swap checks as first written (before
P16's speed-ups): the plain implementation the fast one must match, copy for copy
(tests/kv/test_prefix_fast.py, tests/sim/test_prefix_sim_fast.py).

`reference_block_manager()` gives a BlockManager whose prefix cache and swap checks
are these.
"""

from __future__ import annotations

from collections.abc import Hashable

from fsd.jobs import KVLocation
from fsd.kv.block_manager import BlockManager, HasBlocks
from fsd.kv.pool import BlockPool
from fsd.kv.prefix import ROOT, PrefixCache, undo_counts
from fsd.kv.prefix_types import HasPrefix, counters
from fsd.kv.swap import SwapOp
from fsd.protocol_telemetry import PrefixInfo


class ReferencePrefixCache:
    """fsd.kv.prefix.PrefixCache as first written: one pool call per block, and a
    lookup that walks every job's chain from the root."""

    def __init__(self, device: BlockPool, host: BlockPool, block_size: int) -> None:
        # the fast cache's state (names, tiers, counters, sink and copy rule); the plain
        # methods below, and the pools' evictions handled one block at a time
        PrefixCache.__init__(self, device, host, block_size)  # type: ignore[arg-type]
        self._held: dict[str, tuple[int, list[tuple[int, int, bool]]]] = {}  # for complete
        device.on_evict = lambda evicted: [self._demote(b, uid) for b, uid in evicted]
        host.on_evict = lambda evicted: [self._drop_host(b, uid) for b, uid in evicted]

    # ---- names -----------------------------------------------------------------

    def _intern(self, parent: int, content: Hashable) -> int:
        key = (parent, content)
        uid = self._uid.get(key)
        if uid is None:
            uid = self._uid[key] = next(self._next)
            self._key[uid] = key
        return uid

    def _forget(self, uid: int) -> None:
        if uid not in self.on_device and uid not in self.on_host:
            key = self._key.pop(uid, None)
            if key is not None:
                del self._uid[key]

    def _name(self, pool: BlockPool, where: dict[int, int], block: int, uid: int) -> None:
        """`block` of `pool` holds `uid`'s content (unless the tier has it already)."""
        if uid not in where and block not in pool.cached and uid in self._key:
            where[uid] = block
            pool.mark(block, uid)

    def _lookup(self, job: HasPrefix) -> list[tuple[int, int, bool]]:
        """(uid, block, on the device) of each leading full block found, in order."""
        found: list[tuple[int, int, bool]] = []
        bs, parent = self.block_size, ROOT
        for i in range(job.num_tokens // bs):
            content = job.block_content(i, bs)
            uid = None if content is None else self._uid.get((parent, content))
            if uid is None:
                break
            block = self.on_device.get(uid)
            if block is not None:
                found.append((uid, block, True))
            elif (block := self.on_host.get(uid)) is not None:
                found.append((uid, block, False))
            else:
                break
            parent = uid
        return found

    # ---- a job's prefix ----------------------------------------------------------

    def peek(self, job: HasPrefix) -> int:
        """Tokens `attach` would reuse now (ignoring room), without taking anything."""
        if not self.enabled:
            return 0
        found = self._lookup(job)
        return min(len(found) * self.block_size, max(job.num_tokens - 1, 0))

    def _decide(self, job: HasPrefix) -> tuple[list[tuple[int, int, bool]], int, int, bool]:
        """(found, first host block, tokens reused, copy on write now) as attach decides."""
        found = self._lookup(job)
        bs = self.block_size
        for i, (_, _, on_device) in enumerate(found):
            if not on_device:  # copy the host run only if it beats recomputing it
                if not self.worth_copy(sum(1 for f in found[i:] if not f[2]), i * bs):
                    del found[i:]
                break
        first = next((i for i, f in enumerate(found) if not f[2]), len(found))
        computed, cow = len(found) * bs, False
        if found and computed >= job.num_tokens:
            if first < len(found):
                computed = job.num_tokens - 1
            else:
                idle = sum(1 for _, b, _ in found if self.device.refs(b) == 0)
                cow = self.device.num_free - idle > 0
                computed = job.num_tokens - 1 if cow else (len(found) - 1) * bs
        return found, first, computed, cow

    def plan(self, job: HasPrefix) -> tuple[int, int]:
        if not self.enabled or job.block_table or job.num_computed_tokens:
            return job.num_computed_tokens, len(job.block_table)
        found, first, computed, cow = self._decide(job)
        whole = found and len(found) * self.block_size >= job.num_tokens
        if first < len(found):
            return computed, first
        return computed, len(found) - (1 if whole and not cow else 0)

    def attach(self, job: HasPrefix) -> int:
        """Give a job without KV the cached blocks of its prefix; returns the tokens
        reused. The run from the first host block is held for `complete`."""
        if not self.enabled or job.block_table or job.num_computed_tokens:
            return 0
        found, first, computed, cow = self._decide(job)
        device, host = self.device, self.host
        for _, block, on_device in found:  # pin every block found
            (device if on_device else host).ref(block)
        table = [b for _, b, _ in found[:first]]
        if first < len(found):
            self._held[job.job_id] = (first, found[first:])
        elif found and len(found) * self.block_size >= job.num_tokens:
            last = table.pop()
            if cow:
                dst = device.take(1)[0]
                self.sink(SwapOp(None, "copy", [last], [dst], True))
                table.append(dst)
            device.give((last,))
        job.block_table[:] = table
        kept = len(found) if first < len(found) else len(table)
        job.prefix_uids[:] = [uid for uid, _, _ in found[:kept]]
        job.num_computed_tokens = computed
        host_hit = self.block_size * sum(1 for f in found if not f[2])
        self.queries += job.num_tokens
        self.hits += computed
        self.host_hits += host_hit
        self.lookups += job.num_tokens
        self.lookup_hits += computed
        self._attached[job.job_id] = (computed, host_hit)
        if computed and not job.num_cached_tokens and not job.num_output_tokens:
            job.num_cached_tokens = min(computed, job.num_prompt_tokens)  # its first prefill
        return computed

    def complete(self, job: HasPrefix) -> None:
        """The held run comes back into the job's new blocks, each named there."""
        first, held = self._held.pop(job.job_id, (0, []))
        whole = (first + len(held)) * self.block_size >= job.num_tokens
        for k, (uid, src, on_device) in enumerate(held):
            dst = job.block_table[first + k]
            self.sink(SwapOp(None, "copy" if on_device else "in", [src], [dst], True))
            if k < len(held) - 1 or not whole:
                self._name(self.device, self.on_device, dst, uid)
        self._give_held(held)

    def _give_held(self, held: list[tuple[int, int, bool]]) -> None:
        for _, block, on_device in reversed(held):
            if on_device:
                self.device.give((block,))
        for _, block, on_device in reversed(held):
            if not on_device:
                self.host.give((block,))

    def detach(self, job: HasPrefix) -> None:
        """Undo `attach` for a job that did not run after all (counters included)."""
        self.device.give(reversed(job.block_table))
        self._give_held(self._held.pop(job.job_id, (0, []))[1])
        job.block_table.clear()
        job.num_computed_tokens = 0
        undo_counts(self, job)  # (the counters are the same plain arithmetic)

    def commit(
        self, job: HasPrefix, table: list[int], on_device: bool = True, moved: bool = False
    ) -> None:
        """PrefixCache.commit, one block at a time."""
        if not self.enabled:
            return
        if self._attached:  # it ran: what `attach` counted stays counted
            self._attached.pop(job.job_id, None)
        bs, uids = self.block_size, job.prefix_uids
        full = min(job.num_computed_tokens // bs, len(table))
        start = 0 if moved else len(uids)
        if uids and uids[-1] not in self._key:  # a name forgotten meanwhile: re-derive
            uids.clear()
            start = 0
        if len(uids) < full:
            parent = uids[-1] if uids else ROOT
            for i in range(len(uids), full):
                content = job.block_content(i, bs)
                if content is None:
                    break
                parent = self._intern(parent, content)
                uids.append(parent)
        pool, where = (self.device, self.on_device) if on_device else (self.host, self.on_host)
        for i in range(start, min(full, len(uids))):
            self._name(pool, where, table[i], uids[i])

    # ---- eviction ------------------------------------------------------------------

    def _demote(self, block: int, uid: int) -> None:
        """A device block is evicted: its content moves to the host unless there already."""
        self.on_device.pop(uid, None)
        if uid not in self.on_host and self.host.num_free:
            dst = self.host.take(1)[0]
            self.sink(SwapOp(None, "out", [block], [dst], True))
            self.on_host[uid] = dst
            self.host.mark(dst, uid)
            self.host.give((dst,))
        self._forget(uid)

    def _drop_host(self, block: int, uid: int) -> None:
        self.on_host.pop(uid, None)
        self._forget(uid)

    clear = PrefixCache.clear  # (no per-block step to do plainly)

    def forget_job(self, job_id: str) -> None:
        """(Nothing remembered between lookups.)"""

    def stats(self) -> PrefixInfo:
        return counters(self)


class ReferenceBlockManager(BlockManager):
    """A BlockManager on `ReferencePrefixCache`, with its swap checks, `freed_by` and
    its pool takes (`append`, `_mirror`) as first written."""

    def __init__(self, num_device_blocks: int, block_size: int, num_host_blocks: int = 0) -> None:
        super().__init__(num_device_blocks, block_size, num_host_blocks)
        self.prefix = ReferencePrefixCache(self.device, self.host, block_size)  # type: ignore[assignment]

    def append(self, job: HasBlocks, missing: int | None = None) -> None:
        if missing is None:
            missing = self.missing(job)
        if missing:
            job.block_table.extend(self.device.take(missing))
        self._owners[job.job_id] = job
        if job.kv is KVLocation.NONE:
            self.prefix.complete(job)  # type: ignore[attr-defined]
            self._place(job, KVLocation.DEVICE)

    def _mirror(
        self, job: HasBlocks, table: list[int], pool: BlockPool, to_device: bool
    ) -> tuple[list[int], list[int], list[int]]:
        cached = self._cached(job, table, to_device)
        for b in cached:
            if b is not None:
                pool.ref(b)
        fresh = iter(pool.take(sum(1 for b in cached if b is None)))
        mirror = [next(fresh) if b is None else b for b in cached]
        src = [s for s, b in zip(table, cached, strict=True) if b is None]
        dst = [d for d, b in zip(mirror, cached, strict=True) if b is None]
        return mirror, src, dst

    def freed_by(self, job: HasBlocks) -> int:
        if not self.prefix.enabled:
            return len(job.block_table)
        refs = self.device.refs
        return sum(1 for b in job.block_table if refs(b) == 1)

    def can_swap_out(self, job: HasBlocks) -> bool:
        if not job.block_table or job.host_block_table:
            return False
        return (
            self._room(self.host, self._cached(job, job.block_table, False)) <= self.host.num_free
        )

    def can_swap_in(self, job: HasBlocks) -> bool:
        if not job.host_block_table or job.block_table:
            return False
        need = self._room(self.device, self._cached(job, job.host_block_table, True))
        return need <= self.device.num_free

    def _cached(self, job: HasBlocks, table: list[int], to_device: bool) -> list[int | None]:
        prefix = self.prefix
        uids = getattr(job, "prefix_uids", ())
        if not prefix.enabled or not uids:
            return [None] * len(table)
        where = prefix.on_device if to_device else prefix.on_host
        return [where.get(uids[i]) if i < len(uids) else None for i in range(len(table))]

    @staticmethod
    def _room(pool: BlockPool, cached: list[int | None]) -> int:
        return sum(1 for b in cached if b is None or pool.refs(b) == 0)


def reference_block_manager(
    num_device_blocks: int, block_size: int, num_host_blocks: int = 0
) -> BlockManager:
    return ReferenceBlockManager(num_device_blocks, block_size, num_host_blocks)
