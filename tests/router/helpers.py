"""Hand-built replica states and requests for the router's tests."""

from __future__ import annotations

from typing import Any

from fsd.config import ClusterConfig
from fsd.kv.prefix_events import DEVICE, HOST, STORED, chain_names
from fsd.router.registry import make_router
from fsd.router.router import Router, RouteRequest
from fsd.router.state import ReplicaState
from tests.costs import linear_cost

BS = 16
# prefill 1 ms + 0.1 ms a token; a decode step 10 ms; copies 1 token per us
COST = linear_cost(
    "router-test", (1e-3, 1e-4), (1e-2, 0.0, 0.0), kv_bytes_per_token=1, swap_bytes_per_s=1e6
)
QUANTA = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


def state(replica: int, seq: int = 1, **kw: Any) -> ReplicaState:
    """An idle replica of 8 MLFQ levels with room for everything, changed by `kw`
    (`ahead_all`: the same seconds ahead at every level)."""
    n = len(kw.get("quanta", QUANTA))
    ahead = kw.pop("ahead_all", None)
    fields: dict[str, Any] = {
        "replica": replica, "seq": seq, "time": 0.0, "admitted": 0, "batch_size": 1,
        "scale": 1.0, "quanta": QUANTA, "jobs": (0,) * n, "work": (0.0,) * n,
        "ahead": (0.0,) * n if ahead is None else (float(ahead),) * n, "running": 0,
        "waiting": 0, "mean_output": 0.0, "block_size": BS, "device_free": 10_000,
        "device_total": 10_000, "host_free": 10_000, "host_total": 10_000, "full": seq == 1,
        "events": (),
    }  # fmt: skip
    fields.update(kw)
    return ReplicaState(**fields)


def names(*contents: Any) -> tuple[int, ...]:
    return tuple(chain_names(contents))


def cached(block_names: tuple[int, ...], tier: int = DEVICE) -> tuple[tuple[int, int, int], ...]:
    """STORED events for `block_names` on `tier`."""
    return tuple((STORED, tier, n) for n in block_names)


def request(
    i: int = 0, prompt: int = 64, block_names: tuple[int, ...] = (), session: str | None = None
) -> RouteRequest:
    return RouteRequest(f"q{i}", prompt, block_names, session)


def router(name: str, replicas: int = 2, **cluster: Any) -> Router:
    return make_router(ClusterConfig(replicas=replicas, router=name, **cluster), COST, BS)


__all__ = [
    "BS",
    "COST",
    "DEVICE",
    "HOST",
    "QUANTA",
    "cached",
    "names",
    "request",
    "router",
    "state",
]
