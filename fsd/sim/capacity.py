"""How many KV blocks the simulated device and host hold.

Device, first match wins:
  1. an explicit `num_gpu_blocks` (CacheConfig or argument);
  2. the profile's `notes.kv_capacity_tokens` (the analytic profiles in
     `fsd/cost/profiles/` compute it as GPU memory x utilization - weights -
     activation reserve, over the KV bytes per token, summed over the GPUs of the layout);
  3. `notes.gpu.memory_bytes` x `gpu_memory_utilization` - `notes.weights_bytes_per_gpu`
     - `notes.activation_reserve_bytes_per_gpu` (0 if absent), times
     `notes.layout.num_gpus`, over `kv_bytes_per_token`;
  4. `DEFAULT_GPU_BLOCKS`.
Host: an explicit `num_host_blocks`, else `HOST_TO_DEVICE` x the device pool (the
paper's testbed has 1152 GB of host memory for 8 x 40 GB GPUs; 4x is conservative).
"""

from __future__ import annotations

from dataclasses import dataclass

from fsd.config import CacheConfig
from fsd.cost import CostModel
from fsd.errors import ConfigError

DEFAULT_GPU_BLOCKS = 4096  # 64k tokens at block size 16: an 80 GB GPU serving a 13B model
HOST_TO_DEVICE = 4


@dataclass(frozen=True)
class Pools:
    """Device and host pool sizes in blocks, and where the device size came from."""

    device: int
    host: int
    source: str


def kv_capacity_tokens(cost: CostModel, utilization: float) -> tuple[int, str] | None:
    """Device KV capacity in tokens from the profile's notes, or None if they lack it."""
    notes = cost.notes or {}
    cap = notes.get("kv_capacity_tokens")
    if isinstance(cap, int | float) and cap > 0:
        return int(cap), f"profile {cost.name} notes.kv_capacity_tokens"
    gpu = notes.get("gpu")
    weights = notes.get("weights_bytes_per_gpu")
    layout = notes.get("layout")
    n_gpu = layout.get("num_gpus", 1) if isinstance(layout, dict) else 1
    reserve = notes.get("activation_reserve_bytes_per_gpu", 0)
    reserve = reserve if isinstance(reserve, int | float) else 0  # older profiles lack it
    if isinstance(gpu, dict) and isinstance(weights, int | float) and cost.kv_bytes_per_token > 0:
        memory = gpu.get("memory_bytes")
        if isinstance(memory, int | float):
            free = (memory * utilization - weights - reserve) * n_gpu
            if free > 0:
                tokens = int(free / cost.kv_bytes_per_token)
                return tokens, f"profile {cost.name} notes: GPU memory - weights"
    return None


def size_pools(
    cost: CostModel,
    cache: CacheConfig,
    num_gpu_blocks: int | None = None,
    num_host_blocks: int | None = None,
) -> Pools:
    """Pool sizes for a simulation (see the module docstring for the order of sources)."""
    device = num_gpu_blocks if num_gpu_blocks is not None else cache.num_gpu_blocks
    source = "explicit num_gpu_blocks"
    if device is None:
        found = kv_capacity_tokens(cost, cache.gpu_memory_utilization)
        if found is not None:
            device, source = found[0] // cache.block_size, found[1]
        else:
            device, source = DEFAULT_GPU_BLOCKS, f"default {DEFAULT_GPU_BLOCKS} blocks"
    if device < 1:
        raise ConfigError(f"num_gpu_blocks must be >= 1, got {device}")
    host = num_host_blocks if num_host_blocks is not None else cache.num_host_blocks
    if host is None:
        host = HOST_TO_DEVICE * device
    if host < 0:
        raise ConfigError(f"num_host_blocks must be >= 0, got {host}")
    return Pools(int(device), int(host), source)


def max_context_of(cost: CostModel) -> int | None:
    """The model's context length if the profile's notes name it (notes.model.max_position)."""
    model = (cost.notes or {}).get("model")
    if isinstance(model, dict):
        value = model.get("max_position")
        if isinstance(value, int) and value > 1:
            return value
    return None
