"""The router: N replica views, one policy, and the record of its decisions.

The daemon (or the simulator, fsd.sim.replicas) feeds it each replica's pushed state
(`update`, which says when that replica must resync) and asks it where each new
request goes (`choose`). The request carries its prompt's block content names
(`prompt_names` from its token ids: what the replicas' prefix caches name), so the
router hashes nothing itself. Each decision is timed (`timing`) and the latest are
kept with their reasons (`recent`) for the console.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fsd.kv.prefix_events import chain_names
from fsd.router.estimate import pending_of
from fsd.router.policies import RouterPolicy
from fsd.router.request import RouteRequest
from fsd.router.state import ReplicaState
from fsd.router.view import ReplicaView

RECENT = 256  # decisions kept with their reasons
TIMED = 8192  # decision times kept for the P99


@dataclass(frozen=True)
class Decision:
    """Where one request went, and why."""

    request_id: str
    replica: int
    reason: str
    seconds: float  # the decision's own time (perf_counter)


def prompt_names(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """The content names of a prompt's full blocks, as a replica's prefix cache names
    them (fsd.kv.prefix_events; `Job.block_content` is a block's token ids)."""
    n = len(token_ids) // block_size
    return tuple(
        chain_names(tuple(token_ids[i * block_size : (i + 1) * block_size]) for i in range(n))
    )


class Router:
    """Routes requests over `replicas` replicas with one policy (fsd.router.registry)."""

    def __init__(self, policy: RouterPolicy, replicas: int, block_size: int) -> None:
        if replicas < 1:
            raise ValueError(f"a router needs at least one replica, got {replicas}")
        self.policy = policy
        self.block_size = block_size
        self.views = [ReplicaView(i, block_size) for i in range(replicas)]
        self.resyncs = 0  # resyncs asked for (lost pushes, an index that drifted)
        self._recent: deque[Decision] = deque(maxlen=RECENT)
        self._times: deque[float] = deque(maxlen=TIMED)
        self._count = 0
        self._total_s = 0.0

    @property
    def name(self) -> str:
        return self.policy.name

    def update(self, state: ReplicaState) -> bool:
        """Take a replica's pushed state; True: that replica must send a full state
        next (`StateBuilder.resync`), its pushes having had a gap."""
        if not 0 <= state.replica < len(self.views):
            raise ValueError(
                f"a state of replica {state.replica}; replicas are 0..{len(self.views) - 1}"
            )
        view = self.views[state.replica]
        was = view.stale
        stale = view.update(state)
        self.resyncs += stale and not was
        return stale

    def choose(self, request: RouteRequest, avoid: Collection[int] = ()) -> Decision:
        """The replica for `request`, never one in `avoid` (down or draining) while
        another is left; it counts there until a state acknowledges it."""
        t0 = time.perf_counter()
        views = [v for v in self.views if v.replica not in avoid] or self.views
        i, reason, est = self.policy.pick(views, request)
        view = views[i]
        view.route(pending_of(view, request, est, self.policy.reads_prefixes))
        seconds = time.perf_counter() - t0
        self._count += 1
        self._total_s += seconds
        self._times.append(seconds)
        decision = Decision(request.request_id, view.replica, reason, seconds)
        self._recent.append(decision)
        return decision

    def recent(self) -> list[Decision]:
        """The latest decisions, oldest first."""
        return list(self._recent)

    def timing(self) -> dict[str, float]:
        """Decisions made, and their mean and P99 (of the latest) time in seconds."""
        times = sorted(self._times)
        p99 = times[min(len(times) - 1, int(0.99 * len(times)))] if times else 0.0
        mean = self._total_s / self._count if self._count else 0.0
        return {"decisions": self._count, "mean_s": mean, "p99_s": p99}
