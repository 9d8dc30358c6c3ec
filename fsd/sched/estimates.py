"""When each job runs next (ENST) under the latest decision, what a queued job's
per-token latency will be, and how long a new one waits for its first token: the
estimates the swapper, telemetry and the overload refusals read."""

from __future__ import annotations

from collections.abc import Callable

from fsd.cost import CostModel
from fsd.jobs import Job
from fsd.sched.first_tokens import FirstTokenWait
from fsd.sched.queues import JobQueue
from fsd.sched.room import predicted_latency


class Estimates:
    """ENST of the latest decision, built on first use (most iterations need none),
    and the partly prefilled jobs whose rest of prefill it counts."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.partial: dict[str, Job] = {}  # partly prefilled jobs (chunked prefill)
        self._for: tuple[float, int] = (0.0, 1)  # (now, batch size) of the decision
        self._built: Callable[[Job], float] | None = None
        self.first_tokens = FirstTokenWait()  # the measured wait for a first token

    def forget(self, job: Job) -> None:
        """`job` left the scheduler."""
        self.partial.pop(job.job_id, None)
        self.first_tokens.left(job)

    def __getstate__(self) -> dict[str, object]:
        # picklable for the what-if twin (fsd.twin): the closure is rebuilt on use
        return {**self.__dict__, "_built": None}

    def decided(self, now: float, batch_size: int) -> None:
        """A new decision: the estimates follow it."""
        self._for, self._built = (now, batch_size), None

    def prefilled(self, job: Job) -> None:
        """`job` ran a prefill or a chunk of one: it is partly prefilled or no longer."""
        if job.num_new_tokens > 1:  # it stopped short of the prompt's end
            self.partial[job.job_id] = job
        else:
            self.partial.pop(job.job_id, None)

    def enst(self, queue: JobQueue) -> Callable[[Job], float]:
        """ENST of a job under the latest decision (O(1) once built)."""
        if self._built is None:
            self._built = queue.enst_fn(*self._for, self.pending_prefills())
        return self._built

    def pending_prefills(self) -> list[tuple[Job, float]]:
        """Each partly prefilled job and the seconds of prefill it has left."""
        chunk = self.cost.chunk_time
        pending = []
        for job in self.partial.values():
            done, new = job.num_computed_tokens, job.num_new_tokens
            if done and new > 1:  # (not: its KV was dropped since)
                pending.append((job, chunk(new, done)))
        return pending

    def latency(self, queue: JobQueue, job: Job, now: float, batch_size: int) -> float:
        """Seconds per output token a queued job is predicted to see."""
        return predicted_latency(queue, self.cost, job, now, batch_size, self.pending_prefills())
