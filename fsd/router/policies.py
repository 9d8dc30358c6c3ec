"""Router policies: how a request picks its replica, one class per policy.

`fsd` uses what only fsd's replicas can say: the work queued ahead of the level a
request would enter (skip-join), how much of its prompt each replica caches and on
which tier, and each replica's KV room, for an estimated TTFT per replica
(fsd.router.estimate), plus a quarter of the replica's whole queue (LOAD_WEIGHT).
The baselines are the prior art's rules, by name:

- `round-robin`: each replica in turn.
- `least-loaded`: vLLM's data-parallel balancer, the least 4 x waiting + running.
- `power-of-two`: two replicas drawn at random, the less loaded (4 x waiting + running).
- `cache-aware`: SGLang's router. Balanced, the longest cached prefix if it covers
  more than CACHE_THRESHOLD of the prompt, else the replica caching least; imbalanced
  (max - min > BALANCE_ABS requests and max > BALANCE_REL x min), the shortest queue.

Every policy sees the same views (fsd.router.view), the requests routed since the
last push counted, and returns its choice with a short reason for the console.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fsd.router.estimate import Estimate, estimate
from fsd.router.view import ReplicaView

if TYPE_CHECKING:
    from fsd.config import ClusterConfig
    from fsd.cost import CostModel
    from fsd.router.request import RouteRequest

Pick = tuple[int, str, Estimate | None]  # replica, reason, the estimate if one was made

# SGLang's router defaults (sgl-model-gateway router_args: cache_threshold,
# balance_abs_threshold, balance_rel_threshold)
CACHE_THRESHOLD = 0.3
BALANCE_ABS = 64
BALANCE_REL = 1.5
# fsd: the weight of a replica's whole queued work (seconds over its batch) beside the
# request's own TTFT. Why: a request that starts soon still decodes among that work;
# by TTFT alone, a popular system prompt piles its requests on one replica. 0.25 had
# the least worst-point regret on bench/replicas.py's tuning set (against 0, 0.5, 1,
# and a term for the decode time the replica's batch would give the request).
LOAD_WEIGHT = 0.25
MAX_SESSIONS = 1 << 16  # sessions remembered for affinity (least recently used go)


def imbalanced(loads: Sequence[float], gap: float, ratio: float) -> bool:
    """SGLang's test: the busiest is `gap` above the idlest and `ratio` times it."""
    hi, lo = max(loads), min(loads)
    return hi - lo > gap and hi > ratio * lo


def argmin(values: Sequence[float]) -> int:
    """The first index of the smallest value."""
    return min(range(len(values)), key=values.__getitem__)


def queue_score(view: ReplicaView) -> int:
    """vLLM's load score: 4 x waiting + running."""
    return 4 * view.waiting + view.running


class RouterPolicy(ABC):
    """A way to pick a replica for a request (module doc)."""

    name = "policy"
    reads_prefixes = False  # whether it matches prompts (a routed prompt counts as cached)

    def __init__(self, config: ClusterConfig, cost: CostModel, seed: int = 0) -> None:
        self.config = config
        self.cost = cost
        self.rng = random.Random(seed)

    @abstractmethod
    def pick(self, views: Sequence[ReplicaView], request: RouteRequest) -> Pick:
        """(the position in `views` of the replica, why, its estimate if computed)"""


class RoundRobin(RouterPolicy):
    """Each replica in turn."""

    name = "round-robin"

    def __init__(self, config: ClusterConfig, cost: CostModel, seed: int = 0) -> None:
        super().__init__(config, cost, seed)
        self._turn = 0

    def pick(self, views: Sequence[ReplicaView], request: RouteRequest) -> Pick:
        i = self._turn % len(views)
        self._turn += 1
        return i, "its turn", None


class LeastLoaded(RouterPolicy):
    """vLLM's data-parallel rule: the least 4 x waiting + running."""

    name = "least-loaded"

    def pick(self, views: Sequence[ReplicaView], request: RouteRequest) -> Pick:
        scores = [queue_score(v) for v in views]
        i = argmin(scores)
        v = views[i]
        return i, f"least loaded: 4 x {v.waiting} waiting + {v.running} running", None


class PowerOfTwo(RouterPolicy):
    """Two replicas at random, the less loaded (4 x waiting + running)."""

    name = "power-of-two"

    def pick(self, views: Sequence[ReplicaView], request: RouteRequest) -> Pick:
        if len(views) < 2:
            return 0, "the only replica", None
        a, b = self.rng.sample(range(len(views)), 2)
        i = b if queue_score(views[b]) < queue_score(views[a]) else a
        return i, f"of {a} and {b}: {queue_score(views[i])} load", None


class CacheAware(RouterPolicy):
    """SGLang's router: the longest cached prefix unless imbalanced (module doc)."""

    name = "cache-aware"
    reads_prefixes = True

    def pick(self, views: Sequence[ReplicaView], request: RouteRequest) -> Pick:
        loads = [v.waiting + v.running for v in views]
        if imbalanced(loads, BALANCE_ABS, BALANCE_REL):
            i = argmin(loads)
            return i, f"imbalanced: shortest queue ({loads[i]} jobs)", None
        found = [v.match(request.names)[0] for v in views]
        best = max(range(len(views)), key=lambda k: (found[k], -loads[k]))
        bs = views[best].state.block_size
        rate = found[best] * bs / max(request.prompt_len, 1)
        if rate > CACHE_THRESHOLD:
            return best, f"longest prefix: {found[best]} blocks ({rate:.0%})", None
        sizes = [v.cached_blocks() for v in views]
        i = min(range(len(views)), key=lambda k: (sizes[k], loads[k]))
        return i, f"prefix {rate:.0%} short: smallest cache ({sizes[i]} blocks)", None


class FsdRouter(RouterPolicy):
    """The lowest estimated TTFT (fsd.router.estimate) plus LOAD_WEIGHT x the replica's
    queued work; least work when the replicas are imbalanced (ClusterConfig.imbalance_s
    and imbalance_ratio); a session stays on its replica while that costs at most
    `affinity_s` of TTFT."""

    name = "fsd"
    reads_prefixes = True

    def __init__(self, config: ClusterConfig, cost: CostModel, seed: int = 0) -> None:
        super().__init__(config, cost, seed)
        self._sessions: OrderedDict[str, int] = OrderedDict()

    def pick(self, views: Sequence[ReplicaView], request: RouteRequest) -> Pick:
        cfg, n = self.config, len(views)
        ests = [estimate(v, request, self.cost) for v in views]
        loads = [v.load_s() for v in views]
        if n > 1 and imbalanced(loads, cfg.imbalance_s, cfg.imbalance_ratio):
            i = argmin(loads)
            why = f"imbalanced ({max(loads):.2f} s queued): least work ({loads[i]:.2f} s)"
            return self._remember(request, views, i), why, ests[i]
        i = min(range(n), key=lambda k: (ests[k].ttft + LOAD_WEIGHT * loads[k], loads[k]))
        why = f"{describe(ests[i])}; queue {loads[i]:.2f} s"
        # a session's replica, if it is among the views offered (one down is not)
        prev_id = self._sessions.get(request.session) if request.session is not None else None
        prev = next((k for k, v in enumerate(views) if v.replica == prev_id), None)
        if prev is not None and prev != i and ests[prev].ttft <= ests[i].ttft + cfg.affinity_s:
            i, why = prev, f"session stays: {describe(ests[prev])}"
        return self._remember(request, views, i), why, ests[i]

    def _remember(self, request: RouteRequest, views: Sequence[ReplicaView], i: int) -> int:
        """`i`, with its replica remembered as the request's session's."""
        if request.session is not None and self.config.affinity_s > 0:
            sessions = self._sessions
            sessions[request.session] = views[i].replica
            sessions.move_to_end(request.session)
            if len(sessions) > MAX_SESSIONS:
                sessions.popitem(last=False)
        return i


def describe(e: Estimate) -> str:
    """An estimate as a decision's reason."""
    room = f" + room {e.room:.3f}" if e.room else ""
    cached = (
        f"; cached {e.device_hit} dev + {e.host_hit} host blocks"
        if e.device_hit + e.host_hit
        else ""
    )
    return f"ttft {e.ttft:.3f} s = wait {e.wait:.3f} + prefill {e.prefill:.3f}{room} (level {e.level}){cached}"
