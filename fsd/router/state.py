"""`ReplicaState`: what a replica tells the router after each iteration, and its builder.

A state is small and absolute, but for the prefix cache: the load figures (queued
work per level, jobs, KV free per tier) replace the last ones, while the cached
blocks travel as events since the last push (fsd.kv.prefix_events), which the router's
index applies in order. Each push carries the next sequence number; a router that
sees a gap has lost events, keeps the load figures, and asks for a resync
(`StateBuilder.resync`): the next state is `full`, every block cached as a STORED
event, which replaces the router's index of that replica. The builder sends a full
state on its own when its event log overflowed, and first of all.

`admitted` counts the requests the replica has taken from the router: each one
routed but not yet counted is still the router's optimistic guess (fsd.router.view).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsd.kv.prefix_events import EventTuple, watch
from fsd.router.work import queued_work

if TYPE_CHECKING:
    from fsd.kv.block_manager import BlockManager
    from fsd.sched.scheduler import Scheduler

# the most block events kept between two pushes (past it the next push is a resync)
MAX_EVENTS = 1 << 16


@dataclass(frozen=True)
class ReplicaState:
    """One replica's state as pushed to the router (module doc); plain values only,
    so it pickles for Ray and encodes as msgpack (`to_dict` / `from_dict`)."""

    replica: int
    seq: int  # 1, 2, ...: a gap means a push was lost
    time: float  # the replica's clock when it was built
    admitted: int  # requests taken from the router so far
    batch_size: int  # jobs one iteration runs at most: queued work runs this wide
    scale: float  # measured / profiled iteration time (fsd.cost.calibration)
    quanta: tuple[float, ...]  # per level (one level of inf: a queue without levels)
    jobs: tuple[int, ...]  # unfinished jobs per level
    work: tuple[float, ...]  # their expected service left per level, profile seconds
    ahead: tuple[float, ...]  # service a job entering level L waits behind (fsd.router.work)
    running: int  # jobs of the iteration that just ran
    waiting: int  # the other unfinished jobs
    mean_output: float  # output tokens per finished job, learned (0: not yet)
    block_size: int
    device_free: int
    device_total: int
    host_free: int
    host_total: int
    full: bool  # `events` lists every cached block: replace the index, not update it
    events: tuple[EventTuple, ...] = ()  # (STORED/REMOVED, DEVICE/HOST, content name)

    @classmethod
    def empty(cls, replica: int, block_size: int = 16) -> ReplicaState:
        """A replica not heard from yet: idle, its KV size unknown (none assumed short)."""
        big = 1 << 40
        return cls(
            replica, 0, 0.0, 0, 1, 1.0, (math.inf,), (0,), (0.0,), (0.0,), 0, 0, 0.0,
            block_size, big, big, 0, 0, False,
        )  # fmt: skip

    @property
    def queued(self) -> int:
        return self.running + self.waiting

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplicaState:
        """The inverse of `to_dict` after a msgpack round trip (lists back to tuples)."""
        fields = dict(data)
        for name in ("quanta", "jobs", "work", "ahead"):
            fields[name] = tuple(fields[name])
        fields["events"] = tuple(tuple(e) for e in fields.get("events", ()))
        return cls(**fields)


class StateBuilder:
    """Builds one replica's successive states; it watches the replica's prefix cache
    from its creation on (fsd.kv.prefix_events.watch)."""

    def __init__(self, replica: int, blocks: BlockManager, max_events: int = MAX_EVENTS) -> None:
        self.replica = replica
        self.blocks = blocks
        self.events = watch(blocks.prefix, max_events)
        self.seq = 0

    def resync(self) -> None:
        """The router lost a push: the next state lists every cached block."""
        self.events.overflowed = True

    def build(self, sched: Scheduler, now: float, admitted: int) -> ReplicaState:
        """The replica's state now (call it after an iteration: `Scheduler.update`)."""
        work = queued_work(sched)
        events = self.events.drain()
        full = events is None
        if events is None:
            events = self.events.snapshot()
        self.seq += 1
        dev, host = self.blocks.device, self.blocks.host
        return ReplicaState(
            self.replica, self.seq, now, admitted, sched.config.max_batch_size,
            sched.live_cost.scale, work.quanta, work.jobs, work.work, work.ahead, work.running,
            work.waiting, work.mean_output, self.blocks.block_size, dev.num_free,
            dev.num_blocks, host.num_free, host.num_blocks, full, tuple(events),
        )  # fmt: skip
