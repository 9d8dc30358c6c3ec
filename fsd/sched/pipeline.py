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

    __slots__ = ("_flight", "busy")

    def __init__(self) -> None:
        self._flight: deque[MB] = deque()
        self.busy: set[str] = set()  # no job is ever in two micro-batches

    def push(self, mb: MB) -> None:
        self._flight.append(mb)
        self.busy.update(job.job_id for job in mb.out.batch)

    def oldest(self) -> MB:
        return self._flight[0]

    def pop(self) -> MB:
        """The oldest micro-batch leaves the pipeline."""
        mb = self._flight.popleft()
        self.busy.difference_update(job.job_id for job in mb.out.batch)
        return mb

    def clear(self) -> list[MB]:
        """Empty the pipeline (its micro-batches are lost); returns them."""
        lost = list(self._flight)
        self._flight.clear()
        self.busy.clear()
        return lost

    def __len__(self) -> int:
        return len(self._flight)

    def __bool__(self) -> bool:
        return bool(self._flight)

    def __iter__(self) -> Iterator[MB]:
        return iter(self._flight)
