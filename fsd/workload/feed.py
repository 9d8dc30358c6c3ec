"""A timeline laid on the wall clock: which of its steps are due now.

The one real-time scenario player's core: the daemon keeps one `TimelineFeed` per
injected scenario and drains the due steps once per turn of its loop, so a scenario
never blocks the engine; `fsctl play` walks a feed on its asyncio loop's clock, on
the client side. Pure Python: no sockets, no engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fsd.workload.timeline import Action, Arrival, Timeline


@dataclass
class TimelineFeed:
    """The steps of `timeline` not yet taken, started at wall time `start`.

    Arrival k gets job id `f"{prefix}{k}"` (in arrival order), known up front so an
    `Inject` can answer with every id at once.
    """

    timeline: Timeline
    start: float
    prefix: str
    tag: str = "injected"
    _steps: list[tuple[float, Arrival | Action]] = field(init=False, repr=False)
    _next: int = field(init=False, default=0)
    _arrived: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._steps = self.timeline.steps()

    @property
    def job_ids(self) -> list[str]:
        return [f"{self.prefix}{k}" for k in range(len(self.timeline.arrivals))]

    @property
    def done(self) -> bool:
        return self._next >= len(self._steps)

    @property
    def pending(self) -> int:
        return len(self._steps) - self._next

    def next_time(self) -> float | None:
        """Wall time of the next step, None when none is left."""
        if self.done:
            return None
        return self.start + self._steps[self._next][0]

    def due(self, now: float) -> list[tuple[float, str | None, Arrival | Action]]:
        """Steps due by `now`: (wall time it was due, job id for an arrival, the step)."""
        out: list[tuple[float, str | None, Arrival | Action]] = []
        while self._next < len(self._steps):
            t, step = self._steps[self._next]
            when = self.start + t
            if when > now:
                break
            self._next += 1
            job_id = None
            if isinstance(step, Arrival):
                job_id = f"{self.prefix}{self._arrived}"
                self._arrived += 1
            out.append((when, job_id, step))
        return out

    def started_ids(self) -> list[str]:
        """Ids of the arrivals taken so far."""
        return [f"{self.prefix}{k}" for k in range(self._arrived)]

    def unstarted_ids(self) -> list[str]:
        """Ids of the arrivals not taken yet."""
        total = len(self.timeline.arrivals)
        return [f"{self.prefix}{k}" for k in range(self._arrived, total)]


async def walk(
    feed: TimelineFeed,
    take: Callable[[Arrival | Action], Awaitable[None]],
    clock: Callable[[], float],
) -> None:
    """Take each step of `feed` once it is due on `clock` (the running asyncio loop's,
    from which `feed.start` was read), in order, awaiting each before the next."""
    while (due := feed.next_time()) is not None:
        if due > clock():
            await asyncio.sleep(due - clock())
        for _, _, step in feed.due(clock()):
            await take(step)
