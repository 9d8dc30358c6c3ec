"""Block accounting and placement for the paged KV cache (no torch: engine and simulator).

The block manager owns where every job's KV is: its block tables, its `kv`
location, the per-tier indexes of jobs whose KV is wholly on one tier, and the
copies in flight. The scheduler asks (`can_append`, `missing`, `on_device`,
`moving`) and calls its verbs; it never sets a job's location itself.

Verb-named contract: `can_allocate / allocate` for a job's first device blocks,
`can_append / append` to grow its table before an iteration, `release` when it
ends (`free` now), `drop` to discard its KV (recompute later), and
`swap_out / swap_in` to move its KV between the device and host tiers. A
synchronous move ends at once; an asynchronous one holds both tables until the
executor reports it done (`swap_done`): the source blocks return to their pool only
then. A block id is in exactly one place: a pool's free list or one job's table;
`check()` verifies that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from fsd.jobs import KVLocation
from fsd.kv.pool import BlockPool
from fsd.kv.prefix import PrefixCache
from fsd.kv.swap import SwapOp


class HasBlocks(Protocol):
    """What the block manager needs of a job."""

    job_id: str
    kv: KVLocation
    block_table: list[int]
    host_block_table: list[int]
    table_epoch: int  # +1 whenever block_table changes other than by growing

    @property
    def num_tokens(self) -> int: ...


@dataclass(frozen=True)
class KVStats:
    """The pools' occupancy, as telemetry publishes it."""

    block_size: int
    device_total: int
    device_used: int
    device_free: int
    host_total: int
    host_used: int


class BlockManager:
    """Owns the device and host pools, every job's block tables and its KV location."""

    def __init__(self, num_device_blocks: int, block_size: int, num_host_blocks: int = 0) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.device = BlockPool(num_device_blocks, "device")
        self.host = BlockPool(num_host_blocks, "host")
        self._owners: dict[str, HasBlocks] = {}
        # jobs whose KV is wholly on one tier (not moving): the candidates for moves
        self.on_device: dict[str, HasBlocks] = {}
        self.on_host: dict[str, HasBlocks] = {}
        self.moving: dict[str, SwapOp] = {}  # asynchronous copies not yet reported done
        self._release_after_move: set[str] = set()  # released while a copy was in flight
        self.prefix = PrefixCache(self.device, self.host, block_size)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def freed_by(self, job: HasBlocks) -> int:
        """Device blocks that moving or dropping the job's KV makes available: shared
        blocks stay with the other jobs holding them (counted once, by no one)."""
        if not self.prefix.enabled:
            return len(job.block_table)
        return list(map(self.device.refs, job.block_table)).count(1)

    def missing(self, job: HasBlocks, upto: int | None = None) -> int:
        """Device blocks the job lacks to hold its first `upto` tokens (default: all
        its current tokens; a prefill chunk needs only the tokens up to its end)."""
        need = self.blocks_for(job.num_tokens if upto is None else upto)
        return max(0, need - len(job.block_table))

    def _place(self, job: HasBlocks, where: KVLocation) -> None:
        """Set a job's KV location and keep the per-tier indexes in step."""
        job.kv = where
        self.on_device.pop(job.job_id, None)
        self.on_host.pop(job.job_id, None)
        if where is KVLocation.DEVICE:
            self.on_device[job.job_id] = job
        elif where is KVLocation.HOST:
            self.on_host[job.job_id] = job

    # ---- device tier -----------------------------------------------------------

    def can_allocate(self, job: HasBlocks) -> bool:
        """Whether a job with no blocks yet can get room for all its current tokens."""
        return self.missing(job) <= self.device.num_free

    def allocate(self, job: HasBlocks) -> None:
        if job.block_table or job.host_block_table:
            raise ValueError(f"{job.job_id} already holds KV blocks")
        self.append(job)

    def can_append(self, job: HasBlocks) -> bool:
        """Whether the job's device table can grow to hold its current tokens."""
        return self.missing(job) <= self.device.num_free

    def append(self, job: HasBlocks, missing: int | None = None) -> None:
        """Grow the job's device table to hold its tokens (`missing`: if already known)."""
        if missing is None:
            missing = self.missing(job)
        if missing:
            job.block_table.extend(_take(self.device, missing))
        self._owners[job.job_id] = job
        if job.kv is KVLocation.NONE:
            self.prefix.complete(job)  # type: ignore[arg-type]  # its held prefix comes back
            self._place(job, KVLocation.DEVICE)

    def free(self, job: HasBlocks) -> None:
        """Return every block the job holds, on both tiers; its KV is gone (its cached
        blocks stay cached, tail first in line for eviction)."""
        self.device.give(reversed(job.block_table))
        self.host.give(reversed(job.host_block_table))
        job.block_table.clear()
        job.table_epoch += 1
        job.host_block_table = ()  # (fsd.jobs: a job without host blocks holds no list)
        self._owners.pop(job.job_id, None)
        self._place(job, KVLocation.NONE)
        self.prefix.forget_job(job.job_id)

    def receive_on_host(self, job: HasBlocks, n: int) -> list[int]:
        """Host blocks for a job that arrives with its KV (moved from another engine's
        host tier); the caller copies the KV into them. MemoryError if they do not fit."""
        if job.block_table or job.host_block_table:
            raise ValueError(f"{job.job_id} already holds KV blocks")
        job.host_block_table = list(_take(self.host, n))
        self._owners[job.job_id] = job
        self._place(job, KVLocation.HOST)
        return list(job.host_block_table)

    def release(self, job: HasBlocks) -> None:
        """The job ended: free its blocks now, or once the copy of its KV in flight ends."""
        if job.job_id in self.moving:
            self._release_after_move.add(job.job_id)
        else:
            self.free(job)

    # ---- prefix cache ----------------------------------------------------------------

    def attach(self, job: HasBlocks) -> int:
        """Give a job without KV its cached prefix (fsd.kv.prefix); the tokens reused.
        Its location stays NONE until `append` places it (or `detach` undoes this)."""
        hit = self.prefix.attach(job)  # type: ignore[arg-type]
        job.prefix_hint = 0  # type: ignore[attr-defined]  # now in num_computed_tokens
        if job.block_table:
            self._owners[job.job_id] = job
        return hit

    def detach(self, job: HasBlocks) -> None:
        """Undo `attach` for a job that does not run after all."""
        self.prefix.detach(job)  # type: ignore[arg-type]
        self._owners.pop(job.job_id, None)

    # ---- moves between tiers ---------------------------------------------------

    def can_swap_out(self, job: HasBlocks) -> bool:
        if not job.block_table or job.host_block_table:
            return False
        return self._fits(job, job.block_table, self.host, False)

    def can_swap_in(self, job: HasBlocks) -> bool:
        if not job.host_block_table or job.block_table:
            return False
        return self._fits(job, job.host_block_table, self.device, True)

    def _fits(self, job: HasBlocks, table: list[int], pool: BlockPool, to_device: bool) -> bool:
        """Whether `pool` has the free blocks moving `table` there takes (`_room`).
        The move takes at most a block per block of the table: when the pool has that
        many free, the table is not read (the planner asks this of every candidate,
        every iteration, and a long context holds thousands of blocks)."""
        free = pool.num_free
        if len(table) <= free:
            return True
        return self._room(pool, self._cached(job, table, to_device)) <= free

    def swap_out(self, job: HasBlocks, sync: bool = False) -> SwapOp:
        """Start copying the job's KV to the host (a `sync` copy is accounted done now).
        Blocks the host already caches are referenced there, not copied."""
        if not self.can_swap_out(job):
            raise MemoryError(f"cannot swap out {job.job_id}: host pool or tables do not allow it")
        job.host_block_table, src, dst = self._mirror(job, job.block_table, self.host, False)
        return self._begin(job, "out", src, dst, sync)

    def swap_in(self, job: HasBlocks, sync: bool = False) -> SwapOp:
        """Start copying the job's KV back to the device (`sync`: accounted done now).
        Blocks the device already caches are referenced there, not copied."""
        if not self.can_swap_in(job):
            raise MemoryError(f"cannot swap in {job.job_id}: device pool or tables do not allow it")
        job.block_table, src, dst = self._mirror(job, job.host_block_table, self.device, True)
        job.table_epoch += 1
        return self._begin(job, "in", src, dst, sync)

    def _cached(self, job: HasBlocks, table: list[int], to_device: bool) -> list[int | None]:
        """For each block of `table`, the block of the other tier that caches the same
        content (None: it must be copied)."""
        prefix, n = self.prefix, len(table)
        uids = getattr(job, "prefix_uids", ())
        if not prefix.enabled or not uids:
            return [None] * n
        where = prefix.on_device if to_device else prefix.on_host
        cached: list[int | None] = list(map(where.get, uids[:n]))
        if len(cached) < n:  # blocks past its names: copied
            cached.extend([None] * (n - len(cached)))
        return cached

    @staticmethod
    def _room(pool: BlockPool, cached: list[int | None]) -> int:
        """Free blocks a move takes: a copy each, and each idle cached block it pins."""
        held = [b for b in cached if b is not None]
        return len(cached) - len(held) + list(map(pool.refs, held)).count(0)

    def _mirror(
        self, job: HasBlocks, table: list[int], pool: BlockPool, to_device: bool
    ) -> tuple[list[int], list[int], list[int]]:
        """The job's table on the other tier, and the (src, dst) blocks to copy."""
        cached = self._cached(job, table, to_device)
        refs, idle = pool._refs, pool._idle
        for b in cached:  # pinned first (`pool.ref`): the copies' blocks may evict idle ones
            if b is not None:
                if not refs[b]:
                    del idle[b]
                refs[b] += 1
        fresh = iter(_take(pool, cached.count(None)))
        mirror = [next(fresh) if b is None else b for b in cached]
        src = [s for s, b in zip(table, cached, strict=True) if b is None]
        dst = [d for d, b in zip(mirror, cached, strict=True) if b is None]
        return mirror, src, dst

    def _begin(
        self, job: HasBlocks, direction: Literal["out", "in"], src: list[int], dst: list[int],
        sync: bool,
    ) -> SwapOp:  # fmt: skip
        op = SwapOp(job, direction, list(src), list(dst), sync or not src)
        if op.sync:  # the executor completes it before the step (or nothing to copy)
            self._end(op)
        else:
            self.moving[job.job_id] = op
            out = direction == "out"
            self._place(job, KVLocation.SWAPPING_OUT if out else KVLocation.SWAPPING_IN)
        return op

    def swap_done(self, op: SwapOp) -> None:
        """The executor finished an asynchronous copy."""
        job = op.job
        self.moving.pop(job.job_id, None)
        self._end(op)
        if job.job_id in self._release_after_move:
            self._release_after_move.discard(job.job_id)
            self.free(job)

    def _end(self, op: SwapOp) -> None:
        job = op.job
        if op.direction == "out":
            self.prefix.commit(job, job.host_block_table, on_device=False, moved=True)
            self.device.give(reversed(job.block_table))
            job.block_table = []
            job.table_epoch += 1
            self._place(job, KVLocation.HOST)
        else:
            self.prefix.commit(job, job.block_table, moved=True)
            self.host.give(reversed(job.host_block_table))
            job.host_block_table = []
            self._place(job, KVLocation.DEVICE)

    # ---- views -----------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return self.device.num_free

    @property
    def num_used(self) -> int:
        return self.device.num_used

    def stats(self) -> KVStats:
        dev, host = self.device, self.host
        return KVStats(
            self.block_size, dev.num_blocks, dev.num_used, dev.num_free, host.num_blocks,
            host.num_used,
        )  # fmt: skip

    def check(self) -> None:
        """Every block is free, idle (cached, unreferenced) or referenced, exactly once,
        and a referenced block's count is the number of tables holding it; the cache's
        names and the pools agree. Raise AssertionError if not."""
        prefix = self.prefix
        for pool, table_of, where in (
            (self.device, lambda j: j.block_table, prefix.on_device),
            (self.host, lambda j: j.host_block_table, prefix.on_host),
        ):
            held: dict[int, int] = {}
            for job in self._owners.values():
                for b in table_of(job):
                    held[b] = held.get(b, 0) + 1
            free, idle = pool.free_ids(), pool.idle_ids()
            if len(set(free)) != len(free):
                raise AssertionError(f"a {pool.name} block is twice in the free list")
            for state, blocks in (("free", free), ("idle", idle)):
                for b in blocks:
                    if b in held:
                        raise AssertionError(f"{pool.name} block {b} is {state} and in a table")
            if set(free) & set(idle):
                raise AssertionError(f"a {pool.name} block is both free and idle")
            for b, n in held.items():
                if pool.refs(b) != n:
                    raise AssertionError(
                        f"{pool.name} block {b} is in {n} tables but counted {pool.refs(b)}"
                    )
            if len(free) + len(idle) + len(held) != pool.num_blocks:
                lost = pool.num_blocks - len(free) - len(idle) - len(held)
                raise AssertionError(f"{lost} {pool.name} blocks are lost")
            if any(b not in pool.cached for b in idle):
                raise AssertionError(f"an idle {pool.name} block holds nothing cached")
            for uid, b in where.items():
                if pool.cached.get(b) != uid:
                    raise AssertionError(f"{pool.name} block {b} does not hold cached {uid}")
            if len(where) != len(pool.cached):
                raise AssertionError(f"{pool.name} cache and pool disagree on what is cached")


def _take(pool: BlockPool, n: int) -> list[int]:
    """`pool.take(n)`: its free blocks, then its least recently used idle ones, evicted
    through one `on_evict` (the prefix cache moves them down), in the same order.
    A loop of its own: a long context evicts thousands of blocks at a time."""
    free, evict = pool._free, pool.on_evict
    if n <= len(free) or n > pool.num_free or evict is None:
        return pool.take(n)  # (nothing to evict, or its MemoryError)
    idle, cached = pool._idle, pool.cached
    out = list(free)
    free.clear()
    evicted = [idle.popitem(last=False)[0] for _ in range(n - len(out))]
    pool.evictions += len(evicted)
    evict([(block, cached.pop(block)) for block in evicted])
    out += evicted
    refs = pool._refs
    for block in out:  # (no eviction reads a count)
        refs[block] = 1
    return out
