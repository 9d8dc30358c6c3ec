"""The router's picture of one replica: its last state, its prefix index, and the
requests routed to it that no state has counted yet.

Optimistic accounting (vLLM's DP balancer, Dynamo's slots): between two pushes the
router is the only one who knows what it sent. A request routed here is `Pending`
until a state's `admitted` counts it; meanwhile it adds to the replica's waiting
jobs, its queued work at and below its level, and the device blocks it will take,
and its prompt's blocks count as cached here (they will be, by the time a later
request with the same prefix runs). Without this, every request of a burst between
two pushes would see the same state and go to the same replica.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from fsd.router.index import PrefixIndex
from fsd.router.state import ReplicaState
from fsd.router.work import contribution, level_starts

MAX_PENDING = 4096  # requests routed and not yet counted, per replica (a lost one ages out)


@dataclass(frozen=True)
class Pending:
    """A request routed to a replica that its states have not counted yet."""

    ordinal: int  # the replica has taken it once its `admitted` reaches this
    level: int  # the level it enters there
    prefill: float  # its prefill left there, profile seconds
    expected: float  # its expected decode service, profile seconds (inf: unknown)
    blocks: int  # device blocks it will take
    names: tuple[int, ...]  # its prompt's block content names


class ReplicaView:
    """One replica as the router sees it (module doc)."""

    def __init__(self, replica: int, block_size: int) -> None:
        self.replica = replica
        self.state = ReplicaState.empty(replica, block_size)
        self.index = PrefixIndex()
        self.pending: deque[Pending] = deque()
        self.sent = 0  # requests routed here so far
        self.stale = False  # events were lost: the index waits for a full state
        self.starts = level_starts(self.state.quanta)
        self._names: dict[int, int] = {}  # pending requests' block names -> how many

    def update(self, state: ReplicaState) -> bool:
        """Take a pushed state; True while the replica should send a full one."""
        if state.seq <= self.state.seq and not state.full:
            return self.stale  # an older push arriving late: the newer one stands
        gap = state.seq != self.state.seq + 1
        self.state = state
        self.starts = level_starts(state.quanta)
        self._acknowledge(state.admitted)
        fits = self.index.apply(state.events, state.full, state.device_total + state.host_total)
        if state.full:
            self.stale = not fits
        elif gap or not fits:
            self.stale = True  # the events in between are lost: approximate until resync
        return self.stale

    def _acknowledge(self, admitted: int) -> None:
        pending = self.pending
        while pending and pending[0].ordinal <= admitted:
            self._forget(pending.popleft())

    def _forget(self, p: Pending) -> None:
        names = self._names
        for name in p.names:
            n = names[name] - 1
            if n:
                names[name] = n
            else:
                del names[name]

    def route(self, p: Pending) -> None:
        """A request was routed here (its `ordinal` is `sent` after this)."""
        if len(self.pending) >= MAX_PENDING:
            self._forget(self.pending.popleft())
        self.pending.append(p)
        names = self._names
        for name in p.names:
            names[name] = names.get(name, 0) + 1

    def next_ordinal(self) -> int:
        self.sent += 1
        return self.sent

    # ---- the figures, with the pending requests counted ------------------------------

    @property
    def waiting(self) -> int:
        return self.state.waiting + len(self.pending)

    @property
    def running(self) -> int:
        return self.state.running

    def ahead(self, level: int) -> float:
        """Profile seconds of service a new job entering `level` waits behind."""
        ahead = self.state.ahead
        level = min(max(level, 0), len(ahead) - 1)
        total = ahead[level]
        for p in self.pending:
            if p.level > level:
                continue
            pairs = contribution(
                min(p.level, len(ahead) - 1), 0.0, p.prefill, p.expected, self.starts
            )
            total += next((s for lv, s in pairs if lv == level), pairs[-1][1])
        return total

    def work(self) -> float:
        """Profile seconds of service queued here in all."""
        end = self.starts[-1]
        extra = sum(
            p.prefill + min(p.expected, end - self.starts[min(p.level, len(self.starts) - 2)])
            for p in self.pending
        )
        return sum(self.state.work) + extra

    def load_s(self) -> float:
        """Seconds the queued work keeps the replica busy: its work over the batch."""
        st = self.state
        return self.work() * st.scale / max(st.batch_size, 1)

    @property
    def device_free(self) -> int:
        return self.state.device_free - sum(p.blocks for p in self.pending)

    def match(self, names: tuple[int, ...]) -> tuple[int, int]:
        """(found, on host): the request's leading blocks cached here (fsd.router.index)."""
        return self.index.match(names, self._names)

    def cached_blocks(self) -> int:
        """Names cached here, the pending requests' included (cache-aware's tree size)."""
        return len(self.index) + len(self._names)
