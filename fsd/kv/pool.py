"""One memory tier's blocks, reference-counted (no torch: engine and simulator).

With a prefix cache a block may sit in several jobs' tables. A block is in exactly
one of three states: free (no content worth keeping), idle (it holds a cached
prefix block that no job references: reusable, evicted in LRU order when the free
list runs dry) or referenced (its count is the number of tables holding it).
Without a prefix cache no block is ever idle and the pool is the plain free list.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable


class BlockPool:
    """The blocks of one tier: a free list, an LRU of idle cached blocks, and counts."""

    def __init__(self, num_blocks: int, name: str = "device") -> None:
        if num_blocks < 0:
            raise ValueError(f"{name} pool size must be >= 0, got {num_blocks}")
        self.name = name
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self.cached: dict[int, int] = {}  # block -> name (uid) of the content it holds
        self._idle: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced: LRU first
        # called with the (block, uid) of each idle block one take evicted for new content
        self.on_evict: Callable[[list[tuple[int, int]]], None] | None = None
        self.evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks `take` can hand out now (free, or idle and evictable)."""
        return len(self._free) + len(self._idle)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_idle(self) -> int:
        return len(self._idle)

    def take(self, n: int) -> list[int]:
        """`n` blocks, each referenced once: free ones first, then the least recently
        used idle ones (each evicted: `on_evict` sees what it held)."""
        if n > self.num_free:
            raise MemoryError(f"{self.name} pool: asked for {n} blocks, {self.num_free} free")
        free, refs = self._free, self._refs
        out: list[int] = []
        evicted: list[tuple[int, int]] = []
        for _ in range(n):
            if free:
                b = free.popleft()
            else:
                b = self._idle.popitem(last=False)[0]
                evicted.append((b, self.cached.pop(b)))
                self.evictions += 1
            refs[b] = 1
            out.append(b)
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)
        return out

    def ref(self, block: int) -> None:
        """One more table holds `block` (an idle block stops being evictable)."""
        if self._refs[block] == 0:
            if block not in self._idle:
                raise AssertionError(f"{self.name} block {block} is free, not cached")
            del self._idle[block]
        self._refs[block] += 1

    def give(self, blocks: Iterable[int]) -> None:
        """One table fewer holds each block; unreferenced, it becomes idle if it holds a
        cached block (most recently used: give a table tail first so its tail, the
        least shareable part, is evicted first), free otherwise."""
        refs, cached = self._refs, self.cached
        for b in blocks:
            r = refs[b] - 1
            if r < 0:
                raise AssertionError(f"{self.name} block {b} given back more than taken")
            refs[b] = r
            if r == 0:
                if b in cached:
                    self._idle[b] = None
                else:
                    self._free.append(b)

    def mark(self, block: int, uid: int) -> None:
        """`block` (referenced) now holds the cached content named `uid`."""
        self.cached[block] = uid

    def unmark(self, block: int) -> None:
        """`block` no longer holds cached content (an idle one becomes free)."""
        self.cached.pop(block, None)
        if block in self._idle:
            del self._idle[block]
            self._free.append(block)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def free_ids(self) -> list[int]:
        return list(self._free)

    def idle_ids(self) -> list[int]:
        return list(self._idle)
