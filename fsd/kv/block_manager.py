"""Block accounting for the paged KV cache (no torch: shared by engine and simulator).

Verb-named contract: `can_allocate / allocate` for a job's first device blocks,
`can_append / append` to grow its table before an iteration, `free` when it ends,
and `begin_swap_out / end_swap_out`, `begin_swap_in / end_swap_in` to move its KV
between the device and host tiers. During a move the job holds both tables; the
source blocks return to their pool only when the copy has ended. A block id is in
exactly one place: a pool's free list or one job's table; `check()` verifies that.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Protocol

from fsd.kv.swap import SwapOp


class HasBlocks(Protocol):
    """What the block manager needs of a job."""

    job_id: str
    block_table: list[int]
    host_block_table: list[int]

    @property
    def num_tokens(self) -> int: ...


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
    """Owns the device and host pools and every job's block tables."""

    def __init__(self, num_device_blocks: int, block_size: int, num_host_blocks: int = 0) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.device = BlockPool(num_device_blocks, "device")
        self.host = BlockPool(num_host_blocks, "host")
        self._owners: dict[str, HasBlocks] = {}

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def missing(self, job: HasBlocks) -> int:
        """Device blocks the job lacks to hold all its current tokens."""
        return max(0, self.blocks_for(job.num_tokens) - len(job.block_table))

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

    def free(self, job: HasBlocks) -> None:
        """Return every block the job holds, on both tiers."""
        self.device.give(job.block_table)
        self.host.give(job.host_block_table)
        job.block_table.clear()
        job.host_block_table.clear()
        self._owners.pop(job.job_id, None)

    # ---- moves between tiers ---------------------------------------------------

    def can_swap_out(self, job: HasBlocks) -> bool:
        return 0 < len(job.block_table) <= self.host.num_free and not job.host_block_table

    def begin_swap_out(self, job: HasBlocks, sync: bool = False) -> SwapOp:
        if not self.can_swap_out(job):
            raise MemoryError(f"cannot swap out {job.job_id}: host pool or tables do not allow it")
        job.host_block_table = self.host.take(len(job.block_table))
        return SwapOp(job, "out", list(job.block_table), list(job.host_block_table), sync)

    def end_swap_out(self, op: SwapOp) -> None:
        self.device.give(op.src)
        op.job.block_table = []

    def can_swap_in(self, job: HasBlocks) -> bool:
        return 0 < len(job.host_block_table) <= self.device.num_free and not job.block_table

    def begin_swap_in(self, job: HasBlocks, sync: bool = False) -> SwapOp:
        if not self.can_swap_in(job):
            raise MemoryError(f"cannot swap in {job.job_id}: device pool or tables do not allow it")
        job.block_table = self.device.take(len(job.host_block_table))
        return SwapOp(job, "in", list(job.host_block_table), list(job.block_table), sync)

    def end_swap_in(self, op: SwapOp) -> None:
        self.host.give(op.src)
        op.job.host_block_table = []

    # ---- views -----------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return self.device.num_free

    @property
    def num_used(self) -> int:
        return self.device.num_used

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
