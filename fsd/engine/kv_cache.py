"""The device KV pool: one tensor for all layers, sized from a memory budget.

Layout [num_layers, 2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]: a block
id names the same slot in every layer, so moving a job's KV between tiers is one
indexed copy per tier, and each layer's attention sees plain per-layer views.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fsd.config import CacheConfig
from fsd.errors import ConfigError


@dataclass(frozen=True)
class KVShape:
    """Per-layer shape of one KV block."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_block(self, block_size: int) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * block_size * self.num_kv_heads * self.head_dim * elem


def num_device_blocks(cfg: CacheConfig, shape: KVShape, device: torch.device) -> int:
    """Blocks that fit the budget: a fraction of free GPU memory, or bytes on CPU."""
    if cfg.num_gpu_blocks is not None:
        return cfg.num_gpu_blocks
    per_block = shape.bytes_per_block(cfg.block_size)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = free - int(total * (1.0 - cfg.gpu_memory_utilization))
        if budget < per_block:
            gib = 1 << 30
            raise ConfigError(
                f"no KV block fits on {device}: {free / gib:.1f} of {total / gib:.1f} GiB are "
                f"free and gpu_memory_utilization {cfg.gpu_memory_utilization} leaves "
                f"{total * (1.0 - cfg.gpu_memory_utilization) / gib:.1f} GiB unused; another "
                "process (or an engine not closed) holds the rest. Raise "
                "gpu_memory_utilization or set num_gpu_blocks"
            )
    else:
        budget = cfg.cpu_device_kv_bytes
    blocks = budget // per_block
    if blocks < 1:
        raise ConfigError(
            f"the KV budget ({budget} bytes) holds no block of {per_block} bytes; "
            "raise gpu_memory_utilization / cpu_device_kv_bytes or set num_gpu_blocks"
        )
    return int(blocks)


def num_host_blocks(cfg: CacheConfig, shape: KVShape) -> int:
    """Host-tier blocks: explicit, or as many as host_kv_bytes holds."""
    if cfg.num_host_blocks is not None:
        return cfg.num_host_blocks
    return int(cfg.host_kv_bytes // shape.bytes_per_block(cfg.block_size))


class KVCachePool:
    """The tensor behind one tier's blocks, with per-layer (K, V) views."""

    def __init__(
        self, shape: KVShape, num_blocks: int, block_size: int, device: torch.device
    ) -> None:
        self.shape = shape
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.data = torch.zeros(
            (shape.num_layers, 2, num_blocks, block_size, shape.num_kv_heads, shape.head_dim),
            dtype=shape.dtype,
            device=device,
            pin_memory=False,
        )
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (self.data[i, 0], self.data[i, 1]) for i in range(shape.num_layers)
        ]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()
