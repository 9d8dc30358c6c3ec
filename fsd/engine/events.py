"""What happened to jobs, as it happened: the raw material of telemetry events.

Recording is off by default (the offline API has no reader); the daemon turns it
on and drains the log after every iteration, so it stays short. A log nobody drains
keeps the latest MAX_EVENTS events (`dropped` counts the older ones it let go).

Levels: the scheduler counts them from 0 (`Job.level`), operators from Q1. An event's
`level` detail is recorded 1-based (1 = Q1, the top level), as every level a user or a
client sees is (protocol v2): callers pass the job's own `level`, `add` converts it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fsd.jobs import Job
from fsd.kv.swap import SwapOp
from fsd.sched.decision import SchedulerOutput

MAX_EVENTS = 65_536  # events an undrained log holds at most (a few hundred bytes each)


def wire_level(level: int) -> int:
    """The level a user or a client sees (1 = Q1) of a scheduler level (0 = the top)."""
    return level + 1


@dataclass(frozen=True)
class EngineEvent:
    """arrive, start, preempt, demote, promote, recompute, swap-out-begin/-end,
    swap-in-begin/-end, finish, abort, retune. `detail["level"]` is 1-based (Q1 = 1)."""

    time: float
    kind: str
    job_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class EventLog:
    """An append-only buffer the daemon drains, of the latest `cap` events at most."""

    def __init__(self, enabled: bool = False, cap: int = MAX_EVENTS) -> None:
        self.enabled = enabled
        self.dropped = 0  # events let go, undrained, to keep the latest `cap`
        self.count = 0  # events that happened, recorded or not: a change's mark
        self._items: deque[EngineEvent] = deque(maxlen=cap)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, now: float, kind: str, job: Job | None = None, **detail: Any) -> None:
        """Record an event; a `level` detail is the scheduler's 0-based level."""
        self.count += 1
        if self.enabled:
            if "level" in detail:  # one place turns it into Q-numbering for every caller
                detail["level"] = wire_level(detail["level"])
            items = self._items
            if len(items) == items.maxlen:
                self.dropped += 1
            items.append(EngineEvent(now, kind, job.job_id if job else None, detail))

    def drain(self) -> list[EngineEvent]:
        items = list(self._items)
        self._items.clear()
        return items

    def schedule(self, out: SchedulerOutput, now: float) -> None:
        """Events of one scheduling decision (before the step runs)."""
        if not self.enabled:
            return
        for job in out.promoted:
            self.add(now, "promote", job, level=job.level)
        for job in out.preempted:
            self.add(now, "preempt", job, level=job.level)
        for job in out.recomputed:
            self.add(now, "recompute", job)
        for op in out.swap_out + out.swap_in:
            self.swap(op, now, "begin")
            if op.sync:
                self.swap(op, now, "end")
        for job in out.batch:
            fresh = job.num_computed_tokens == job.num_cached_tokens  # (a cached prefix)
            if not job.output_token_ids and fresh and not job.recomputes:
                self.add(now, "start", job, level=job.level)

    def swap(self, op: SwapOp, now: float, phase: str) -> None:
        self.add(now, f"swap-{op.direction}-{phase}", op.job, blocks=op.num_blocks, sync=op.sync)

    def demoted(self, jobs: list[Job], now: float) -> None:
        for job in jobs:
            self.add(now, "demote", job, level=job.level)
