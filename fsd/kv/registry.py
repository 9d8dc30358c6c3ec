"""KV policy names → classes (the one list: the help text reads it, and a name is checked
here, where the policy is built, and early on the start and retune paths)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsd.errors import ConfigError
from fsd.kv.block_manager import BlockManager
from fsd.kv.planner import ArrivalEstimate
from fsd.kv.policies import (
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
KV_POLICIES = tuple(KV_POLICY_CLASSES)

__all__ = [
    "KV_POLICIES", "KV_POLICY_CLASSES", "ArrivalEstimate", "KVPolicy", "check_kv_policy",
    "make_kv_policy",
]  # fmt: skip


def check_kv_policy(name: str) -> str:
    """`name` if it is a KV policy, else the one-line error naming every one."""
    if name not in KV_POLICY_CLASSES:
        raise ConfigError(f"kv_policy must be one of {', '.join(KV_POLICIES)}; got {name!r}")
    return name


def make_kv_policy(
    blocks: BlockManager, cache: CacheConfig, cost: CostModel, arrivals: ArrivalEstimate
) -> KVPolicy:
    """The policy `cache.kv_policy` names, over these blocks."""
    return KV_POLICY_CLASSES[check_kv_policy(cache.kv_policy)](blocks, cache, cost, arrivals)
