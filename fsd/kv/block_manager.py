"""Block accounting for the paged KV cache (no torch: shared by engine and simulator).

Verb-named contract: `can_allocate / allocate` for a job's first blocks,
`can_append / append` to grow its table before an iteration, `free` when it ends
or is preempted. A block id is in exactly one place: a pool's free list or one
job's block table; `check()` verifies that.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Protocol


class HasBlocks(Protocol):
    """What the block manager needs of a job."""

    job_id: str
    block_table: list[int]

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
    """Owns the device pool and the block tables of the jobs that hold device KV."""

    def __init__(self, num_device_blocks: int, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.device = BlockPool(num_device_blocks, "device")
        self._owners: dict[str, HasBlocks] = {}

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _missing(self, job: HasBlocks) -> int:
        return max(0, self.blocks_for(job.num_tokens) - len(job.block_table))

    def can_allocate(self, job: HasBlocks) -> bool:
        """Whether a job with no blocks yet can get room for all its current tokens."""
        return self._missing(job) <= self.device.num_free

    def allocate(self, job: HasBlocks) -> None:
        if job.block_table:
            raise ValueError(f"{job.job_id} already holds {len(job.block_table)} blocks")
        self.append(job)

    def can_append(self, job: HasBlocks) -> bool:
        """Whether the job's table can grow to hold its current tokens."""
        return self._missing(job) <= self.device.num_free

    def append(self, job: HasBlocks) -> None:
        missing = self._missing(job)
        if missing:
            job.block_table.extend(self.device.take(missing))
        self._owners[job.job_id] = job

    def free(self, job: HasBlocks) -> None:
        self.device.give(job.block_table)
        job.block_table.clear()
        self._owners.pop(job.job_id, None)

    @property
    def num_free(self) -> int:
        return self.device.num_free

    @property
    def num_used(self) -> int:
        return self.device.num_used

    def check(self) -> None:
        """Every block is free or owned by exactly one job; raise AssertionError if not."""
        seen: dict[int, str] = {}
        for b in self.device.free_ids():
            if b in seen:
                raise AssertionError(f"block {b} is twice in the free list")
            seen[b] = "free"
        for job in self._owners.values():
            for b in job.block_table:
                if b in seen:
                    raise AssertionError(f"block {b} of {job.job_id} is also in {seen[b]}")
                seen[b] = job.job_id
        if len(seen) != self.device.num_blocks:
            raise AssertionError(f"{self.device.num_blocks - len(seen)} device blocks are lost")
