"""What the prefix cache (fsd.kv.prefix) needs of a job and gives: the job's protocol,
what `attach` would give a job, the counters it publishes, and the copy-or-recompute
rule (no torch)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from fsd.protocol_telemetry import PrefixInfo  # its counters as published: one struct


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


@dataclass(frozen=True)
class AttachPlan:
    """What `attach` gives a job (`PrefixCache._plan`)."""

    uids: list[int]
    blocks: list[int]
    on_dev: list[bool]
    first_host: int  # the first host block found (len(blocks): none)
    computed: int  # the tokens reused
    table_len: int  # the device blocks its table starts with
    cow: bool  # its last block is copied now (copy on write)


def counters(cache: Any) -> PrefixInfo:
    """A prefix cache's counters as published (any cache with PrefixCache's fields)."""
    return PrefixInfo(
        enabled=cache.enabled, queries=cache.queries, hits=cache.hits,
        host_hits=cache.host_hits, device_blocks=len(cache.on_device),
        host_blocks=len(cache.on_host), device_evictions=cache.device.evictions,
        host_evictions=cache.host.evictions, lookups=cache.lookups, lookup_hits=cache.lookup_hits,
    )  # fmt: skip


def nowhere(op: Any) -> None:
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
