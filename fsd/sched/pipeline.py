"""Pipeline parallelism's shared rule: which jobs are inside the pipeline (paper §4.3;
how layers split into stages is `fsd.cost.stages`).

A job inside an unfinished micro-batch stays in its queue but is not ready, and its
KV may not move: the engine and the simulator both pass `InFlight.busy` to
`Scheduler.schedule`, and differ only in when a micro-batch leaves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class _HasJobId(Protocol):
    job_id: str


class _HasBatch(Protocol):
    @property
    def batch(self) -> list: ...


class HasOut(Protocol):
    """A micro-batch: whatever carries the scheduler's decision as `out`."""

    @property
    def out(self) -> _HasBatch: ...


MB = TypeVar("MB", bound=HasOut)


class InFlight(Generic[MB]):
    """Micro-batches inside the pipeline, oldest first, and the ids of their jobs."""

    __slots__ = ("_flight", "_settled", "busy")

    def __init__(self) -> None:
        self._flight: deque[MB] = deque()
        self._settled: set[int] = set()  # ids of micro-batches `settle`d
        # the jobs of unsettled micro-batches: no job is ever in two of them
        self.busy: set[str] = set()

    def push(self, mb: MB) -> None:
        self._flight.append(mb)
        self.busy.update(job.job_id for job in mb.out.batch)

    def oldest(self) -> MB:
        return self._flight[0]

    def newest(self) -> MB:
        return self._flight[-1]

    def settle(self, mb: MB) -> None:
        """`mb` is accounted before its tokens come (scheduling one step ahead): its
        jobs may be scheduled again, while it stays in flight until `pop`."""
        self._settled.add(id(mb))
        self.busy.difference_update(job.job_id for job in mb.out.batch)

    def settled(self, mb: MB) -> bool:
        return id(mb) in self._settled

    def pop(self) -> MB:
        """The oldest micro-batch leaves the pipeline."""
        mb = self._flight.popleft()
        if id(mb) in self._settled:
            self._settled.discard(id(mb))
        else:
            self.busy.difference_update(job.job_id for job in mb.out.batch)
        return mb

    def clear(self) -> list[MB]:
        """Empty the pipeline (its micro-batches are lost); returns them."""
        lost = list(self._flight)
        self._flight.clear()
        self._settled.clear()
        self.busy.clear()
        return lost

    def __len__(self) -> int:
        return len(self._flight)

    def __bool__(self) -> bool:
        return bool(self._flight)

    def __iter__(self) -> Iterator[MB]:
        return iter(self._flight)
