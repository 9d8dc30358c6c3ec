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

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from fsd.jobs import KVLocation
from fsd.kv.swap import SwapOp


class HasBlocks(Protocol):
    """What the block manager needs of a job."""

    job_id: str
    kv: KVLocation
    block_table: list[int]
    host_block_table: list[int]

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


class BlockPool:
    """The free list of one memory tier's blocks."""

    def __init__(self, num_blocks: int, name: str = "device") -> None:
        if num_blocks < 0:
            raise ValueError(f"{name} pool size must be >= 0, got {num_blocks}")
        self.name = name
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"{self.name} pool: asked for {n} blocks, {len(self._free)} free")
        return [self._free.popleft() for _ in range(n)]

    def give(self, blocks: Iterable[int]) -> None:
        self._free.extend(blocks)

    def free_ids(self) -> list[int]:
        return list(self._free)


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

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

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
            job.block_table.extend(self.device.take(missing))
        self._owners[job.job_id] = job
        if job.kv is KVLocation.NONE:
            self._place(job, KVLocation.DEVICE)

    def free(self, job: HasBlocks) -> None:
        """Return every block the job holds, on both tiers; its KV is gone."""
        self.device.give(job.block_table)
        self.host.give(job.host_block_table)
        job.block_table.clear()
        job.host_block_table.clear()
        self._owners.pop(job.job_id, None)
        self._place(job, KVLocation.NONE)

    def release(self, job: HasBlocks) -> None:
        """The job ended: free its blocks now, or once the copy of its KV in flight ends."""
        if job.job_id in self.moving:
            self._release_after_move.add(job.job_id)
        else:
            self.free(job)

    # ---- moves between tiers ---------------------------------------------------

    def can_swap_out(self, job: HasBlocks) -> bool:
        return 0 < len(job.block_table) <= self.host.num_free and not job.host_block_table

    def can_swap_in(self, job: HasBlocks) -> bool:
        return 0 < len(job.host_block_table) <= self.device.num_free and not job.block_table

    def swap_out(self, job: HasBlocks, sync: bool = False) -> SwapOp:
        """Start copying the job's KV to the host (a `sync` copy is accounted done now)."""
        if not self.can_swap_out(job):
            raise MemoryError(f"cannot swap out {job.job_id}: host pool or tables do not allow it")
        job.host_block_table = self.host.take(len(job.block_table))
        return self._begin(job, "out", job.block_table, job.host_block_table, sync)

    def swap_in(self, job: HasBlocks, sync: bool = False) -> SwapOp:
        """Start copying the job's KV back to the device (`sync`: accounted done now)."""
        if not self.can_swap_in(job):
            raise MemoryError(f"cannot swap in {job.job_id}: device pool or tables do not allow it")
        job.block_table = self.device.take(len(job.host_block_table))
        return self._begin(job, "in", job.host_block_table, job.block_table, sync)

    def _begin(
        self, job: HasBlocks, direction: Literal["out", "in"], src: list[int], dst: list[int],
        sync: bool,
    ) -> SwapOp:  # fmt: skip
        op = SwapOp(job, direction, list(src), list(dst), sync)
        if sync:  # the executor completes it before the step
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
            self.device.give(op.src)
            job.block_table = []
            self._place(job, KVLocation.HOST)
        else:
            self.host.give(op.src)
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
        """Every block is free or owned by exactly one job; raise AssertionError if not."""
        for pool, table_of in (
            (self.device, lambda j: j.block_table),
            (self.host, lambda j: j.host_block_table),
        ):
            seen: dict[int, str] = {}
            for b in pool.free_ids():
                if b in seen:
                    raise AssertionError(f"{pool.name} block {b} is twice in the free list")
                seen[b] = "free"
            for job in self._owners.values():
                for b in table_of(job):
                    if b in seen:
                        raise AssertionError(
                            f"{pool.name} block {b} of {job.job_id} is also in {seen[b]}"
                        )
                    seen[b] = job.job_id
            if len(seen) != pool.num_blocks:
                raise AssertionError(f"{pool.num_blocks - len(seen)} {pool.name} blocks are lost")
