"""KV policy names → classes (the one list: config validation and help text read it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsd.kv.block_manager import BlockManager
from fsd.kv.policies import (
    ArrivalEstimate,
    DeferPolicy,
    KVPolicy,
    ProactivePolicy,
    ReactivePolicy,
    RecomputePolicy,
)

if TYPE_CHECKING:
    from fsd.config import CacheConfig
    from fsd.cost import CostModel

KV_POLICY_CLASSES: dict[str, type[KVPolicy]] = {
    cls.name: cls for cls in (DeferPolicy, RecomputePolicy, ReactivePolicy, ProactivePolicy)
}

__all__ = ["KV_POLICY_CLASSES", "ArrivalEstimate", "KVPolicy", "make_kv_policy"]


def make_kv_policy(
    blocks: BlockManager, cache: CacheConfig, cost: CostModel, arrivals: ArrivalEstimate
) -> KVPolicy:
    """The policy `cache.kv_policy` names, over these blocks (the name is validated by config)."""
    return KV_POLICY_CLASSES[cache.kv_policy](blocks, cache, cost, arrivals)
