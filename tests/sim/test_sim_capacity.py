"""Pool sizing from explicit settings, profile notes, or the documented default."""

from __future__ import annotations

import pytest

from fsd.config import CacheConfig
from fsd.cost import CostModel
from fsd.cost.profiles import load_profile
from fsd.errors import ConfigError
from fsd.sim.capacity import DEFAULT_GPU_BLOCKS, HOST_TO_DEVICE, max_context_of, size_pools


def test_shipped_profile_notes_give_the_device_pool():
    cost = load_profile("opt-13b-a100")
    pools = size_pools(cost, CacheConfig(block_size=16))
    assert pools.device == cost.notes["kv_capacity_tokens"] // 16
    assert pools.host == HOST_TO_DEVICE * pools.device
    assert "kv_capacity_tokens" in pools.source
    assert max_context_of(cost) == 2048


def test_memory_minus_weights_when_capacity_is_not_noted():
    notes = {
        "gpu": {"memory_bytes": 80e9},
        "weights_bytes_per_gpu": 26e9,
        "layout": {"num_gpus": 2},
    }
    cost = CostModel(name="m", kv_bytes_per_token=1_000_000, notes=notes)
    pools = size_pools(cost, CacheConfig(block_size=16, gpu_memory_utilization=0.9))
    assert pools.device == int((80e9 * 0.9 - 26e9) * 2 / 1e6) // 16
    assert "GPU memory - weights" in pools.source


def test_explicit_sizes_win_and_the_default_is_documented():
    cost = CostModel(name="bare")
    assert size_pools(cost, CacheConfig()).device == DEFAULT_GPU_BLOCKS
    assert size_pools(cost, CacheConfig(num_gpu_blocks=10, num_host_blocks=7)) == size_pools(
        cost, CacheConfig(), 10, 7
    )
    assert size_pools(cost, CacheConfig(), 10).host == 10 * HOST_TO_DEVICE
    assert max_context_of(cost) is None
    with pytest.raises(ConfigError, match="num_gpu_blocks must be >= 1"):
        size_pools(cost, CacheConfig(), 0)
