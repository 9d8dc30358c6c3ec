"""The scheduler interface every policy implements.

Per iteration the engine calls `schedule(now)` for the batch, runs the model, appends
the sampled tokens, then calls `update(output, now)` so the policy can account service,
move jobs between queues and release finished ones. A job not in the batch is
preempted for that iteration and loses nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from fsd.config import SchedConfig
from fsd.jobs import Job, JobStatus, KVLocation
from fsd.kv.block_manager import BlockManager


@dataclass
class SchedulerOutput:
    """One iteration's decision."""

    batch: list[Job] = field(default_factory=list)
    preempted: list[Job] = field(default_factory=list)  # left the device this iteration
    recomputed: list[Job] = field(default_factory=list)  # KV dropped, to be recomputed

    @property
    def num_tokens(self) -> int:
        return sum(j.num_new_tokens for j in self.batch)


class Scheduler(ABC):
    """A scheduling policy over the jobs of one engine."""

    name: ClassVar[str]

    def __init__(self, config: SchedConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks

    @abstractmethod
    def add(self, job: Job) -> None:
        """Take a newly arrived job."""

    @abstractmethod
    def schedule(self, now: float) -> SchedulerOutput:
        """Choose the jobs that run this iteration and make room for their KV."""

    @abstractmethod
    def update(self, output: SchedulerOutput, now: float) -> None:
        """Account the iteration that ran; release the jobs that finished."""

    @abstractmethod
    def jobs(self) -> Iterator[Job]:
        """Every unfinished job this scheduler holds."""

    @abstractmethod
    def remove(self, job: Job) -> None:
        """Forget a job (finished or aborted) and free its KV."""

    def has_unfinished(self) -> bool:
        return any(True for _ in self.jobs())

    def get(self, job_id: str) -> Job | None:
        return next((j for j in self.jobs() if j.job_id == job_id), None)

    def drop_kv(self, job: Job) -> None:
        """Preempt by recomputation: free the job's blocks; it re-prefills later."""
        self.blocks.free(job)
        job.num_computed_tokens = 0
        job.kv = KVLocation.NONE
        job.status = JobStatus.WAITING
        job.preemptions += 1
        job.recomputes += 1
