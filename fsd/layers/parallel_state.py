"""Tensor-parallel group state and the two collectives the layers need.

A process holds one tensor-parallel rank. At world size 1 (the default) every
collective is a no-op, so a single-GPU or CPU engine never touches
torch.distributed. The Ray executor calls `set_tp_group` in each worker after
`torch.distributed.init_process_group` and before the model is built: the
parallel layers read the rank and world size when they are constructed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TPGroup:
    """This process's place in its tensor-parallel group."""

    rank: int = 0
    world_size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup; None = the default group

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"tensor-parallel world size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"tensor-parallel rank {self.rank} not in [0, {self.world_size})")


_STATE = TPGroup()


def set_tp_group(rank: int, world_size: int, group: Any = None) -> TPGroup:
    """Install this process's tensor-parallel rank; returns the previous state."""
    global _STATE
    previous = _STATE
    _STATE = TPGroup(rank=rank, world_size=world_size, group=group)
    return previous


def reset_tp_group() -> None:
    """Back to a single rank (world size 1)."""
    global _STATE
    _STATE = TPGroup()


def get_tp_rank() -> int:
    return _STATE.rank


def get_tp_world_size() -> int:
    return _STATE.world_size


@contextmanager
def tp_group(rank: int, world_size: int, group: Any = None) -> Iterator[TPGroup]:
    """Temporarily act as `rank` of `world_size` (tests, model construction)."""
    previous = set_tp_group(rank, world_size, group)
    try:
        yield _STATE
    finally:
        set_tp_group(previous.rank, previous.world_size, previous.group)


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """Exact division, with a message naming what did not split evenly."""
    if numerator % denominator:
        raise ValueError(
            f"{what} {numerator} is not divisible by the tensor-parallel size {denominator}"
        )
    return numerator // denominator


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the tensor-parallel ranks (in place when distributed)."""
    state = _STATE
    if state.world_size == 1:
        return x
    import torch.distributed as dist

    dist.all_reduce(x, group=state.group)
    return x


def tp_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`, in rank order."""
    state = _STATE
    if state.world_size == 1:
        return x
    import torch.distributed as dist

    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(state.world_size)]
    dist.all_gather(parts, x, group=state.group)
    return torch.cat(parts, dim=dim)
