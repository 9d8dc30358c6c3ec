"""Router names -> policy classes: the one list of routers. `default` names the router
fsd uses when none is given.

A new router is its class (fsd.router.policies) and one line in `ROUTER_TABLE`; the
config, `fsd simulate --router` and the benches read its name from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsd.errors import ConfigError
from fsd.router.policies import (
    CacheAware,
    FsdRouter,
    LeastLoaded,
    PowerOfTwo,
    RoundRobin,
    RouterPolicy,
)
from fsd.router.router import Router

if TYPE_CHECKING:
    from fsd.config import ClusterConfig
    from fsd.cost import CostModel

DEFAULT_ROUTER = "fsd"

ROUTER_TABLE: dict[str, type[RouterPolicy]] = {
    "fsd": FsdRouter,
    "round-robin": RoundRobin,
    "least-loaded": LeastLoaded,
    "power-of-two": PowerOfTwo,
    "cache-aware": CacheAware,
}
ROUTERS = tuple(ROUTER_TABLE)


def resolve_router(name: str) -> str:
    """The router a name means (`default`: DEFAULT_ROUTER); a one-line error if none."""
    resolved = DEFAULT_ROUTER if name == "default" else name
    if resolved in ROUTER_TABLE:
        return resolved
    raise ConfigError(f"unknown router {name!r}; choose one of: default, {', '.join(ROUTERS)}")


check_router = resolve_router  # refuses an unknown name before anything is built


def make_router(config: ClusterConfig, cost: CostModel, block_size: int, seed: int = 0) -> Router:
    """The router `config` names, over `config.replicas` replicas of `block_size` blocks."""
    policy = ROUTER_TABLE[resolve_router(config.router)](config, cost, seed)
    return Router(policy, config.replicas, block_size)
