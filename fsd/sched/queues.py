"""Job orderings: one class per policy behind one queue interface.

A queue only orders jobs and accounts their service; batch formation and KV
memory live in `Scheduler`. `key(job)` sorts like `ordered()` (smaller = runs
sooner) so the scheduler can compare two jobs' priority without a full walk.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass

from fsd.cost import CostModel
from fsd.jobs import Job
from fsd.kv.planner import by_enst_desc
from fsd.sched.lengths import LearnedLengths


@dataclass(frozen=True)
class LevelView:
    """One queue level as telemetry shows it."""

    index: int
    quantum: float | None
    job_ids: tuple[str, ...]


class JobQueue(ABC):
    """Orders the unfinished jobs of one engine."""

    name: str = "queue"
    # measured / profiled seconds of the service `account` is charged (live cost): a
    # queue that adds charged service to profile estimates divides by it
    live_scale: float = 1.0

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self._seq = itertools.count()

    @abstractmethod
    def add(self, job: Job, now: float) -> None:
        """A new arrival."""

    @abstractmethod
    def remove(self, job: Job) -> None:
        """Forget a finished or aborted job."""

    @abstractmethod
    def ordered(self) -> Iterable[Job]:
        """Every job, highest priority first."""

    @abstractmethod
    def key(self, job: Job) -> tuple:
        """A sort key consistent with `ordered()`."""

    @abstractmethod
    def __len__(self) -> int: ...

    def heads(self, n: int) -> Iterable[Job]:
        """The first `n` jobs of each level (or of the whole order), in no set order:
        where each owner's next turn is found without walking a flood's backlog."""
        return itertools.islice(self.ordered(), n)

    def set_running(self, jobs: Iterable[Job]) -> None:  # noqa: B027 (optional hook)
        """The jobs of the batch that just ran, before the next `ordered()` (MLFQ reads it)."""

    def dropped(self, jobs: Iterable[Job]) -> None:  # noqa: B027 (optional hook)
        """Jobs whose KV was dropped this iteration: they re-prefill (gittins re-ranks)."""

    def adopt(self, other: JobQueue) -> bool:
        """Take `other`'s settings keeping this queue's jobs; False if it cannot."""
        return type(other) is type(self)

    def tick(self, now: float) -> list[Job]:
        """Time-driven moves (starvation promotion); returns the jobs moved."""
        return []

    def account(self, ran: Iterable[tuple[Job, float]], now: float) -> list[Job]:
        """Charge each job the profiled time of the iteration it ran; returns demoted jobs."""
        for job, _ in ran:
            job.last_run = now
        return []

    def levels(self) -> list[LevelView]:
        return [LevelView(0, None, tuple(j.job_id for j in self.ordered()))]

    def limits(self) -> tuple[list[float], float | None, float | None]:
        """The quanta, the starvation limit and the waiting jobs' limit (none here)."""
        return [], None, None

    def new_jobs_in_top_levels(self, k: int, cap: int) -> int:
        """Jobs without KV in the k highest levels, counted up to `cap` (0 without levels)."""
        return 0

    def learned(self) -> LearnedLengths | None:
        """The output-length distribution learned from finished jobs (None: none learned)."""
        return None

    def level_backlog(self, job: Job, batch_size: int) -> float:
        """Seconds of work queued beside `job` that `enst_fn` does not count (0 here: a
        ranking's ENST already counts every job ahead)."""
        return 0.0

    def tokens_left(self, job: Job) -> float | None:
        """Expected output tokens `job` has still to generate (None: this queue cannot
        tell). The swap gate (fsd.kv.planner.SwapGate) weighs victims by it."""
        return None


    def ranks(self) -> dict[str, int]:
        """Every job's place in `ordered()` (0 runs first): one walk, for telemetry."""
        return {job.job_id: i for i, job in enumerate(self.ordered())}

    def rank(self, job: Job) -> int:
        """How many jobs come before `job` in `ordered()`."""
        for i, other in enumerate(self.ordered()):
            if other is job:
                return i
        return len(self)

    def enst_fn(
        self, now: float, batch_size: int, pending: Sequence[tuple[Job, float]] = ()
    ) -> Callable[[Job], float]:
        """Estimated next scheduled time (seconds from now) as a function of the job.

        Without levels, a job waits for the jobs ahead of it to go through in
        batches; each batch costs about one decode step. `pending`: partly prefilled
        jobs and the seconds of prefill they have left (a queue with levels counts
        them above the levels below theirs; a ranking alone does not).
        """
        step = self.cost.min_iteration_time
        b = max(batch_size, 1)
        return lambda job: (self.rank(job) // b) * step

    def largest_enst_first(
        self,
        jobs: Iterable[Job],
        chosen: Container[str],
        enst: Callable[[Job], float],
    ) -> Iterator[tuple[float, Job]]:
        """(ENST, job) for `jobs` (whose ids are exactly `chosen`), largest ENST first.

        A queue with levels may ignore `jobs` and walk its own levels lazily, taking
        the jobs whose ids are in `chosen`.
        """
        return by_enst_desc(jobs, enst)

    def enst(self, jobs: Iterable[Job], now: float, batch_size: int) -> dict[str, float]:
        """ENST of each of `jobs`."""
        fn = self.enst_fn(now, batch_size)
        return {j.job_id: fn(j) for j in jobs}

    def _stamp(self, job: Job, now: float) -> None:
        job.queue_seq = next(self._seq)
        job.last_run = now
