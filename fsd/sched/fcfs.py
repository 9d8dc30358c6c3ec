"""Iteration-level first-come-first-served (vLLM / Orca style).

Running jobs continue every iteration; waiting jobs are admitted in arrival order
while the batch and the device pool have room. When a running job cannot grow its
block table, the most recently admitted job is preempted by recomputation, so the
oldest jobs always make progress and nothing deadlocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from fsd.jobs import Job, JobStatus, KVLocation
from fsd.sched.base import Scheduler, SchedulerOutput


class FCFSScheduler(Scheduler):
    """Run-to-completion in arrival order, one token per iteration per job."""

    name = "fcfs"

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []

    def add(self, job: Job) -> None:
        self.waiting.append(job)

    def jobs(self) -> Iterator[Job]:
        yield from self.running
        yield from self.waiting

    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_batch_tokens
        for job in list(self.running):
            if job not in self.running:  # preempted below as someone's victim
                continue
            while not self.blocks.can_append(job):
                victim = self.running.pop()
                self.drop_kv(victim)
                self.waiting.appendleft(victim)
                out.preempted.append(victim)
                out.recomputed.append(victim)
                if victim is job:
                    break
            else:
                self.blocks.append(job)
                out.batch.append(job)
                budget -= job.num_new_tokens
        if not out.preempted:
            self._admit(out, budget)
        for job in out.batch:
            job.status = JobStatus.RUNNING
        return out

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and len(out.batch) < self.config.max_batch_size:
            job = self.waiting[0]
            if job.num_new_tokens > budget or not self.blocks.can_allocate(job):
                return
            self.waiting.popleft()
            self.blocks.allocate(job)
            job.kv = KVLocation.DEVICE
            self.running.append(job)
            out.batch.append(job)
            budget -= job.num_new_tokens

    def update(self, output: SchedulerOutput, now: float) -> None:
        for job in output.batch:
            if job.status.finished:
                self.remove(job)

    def remove(self, job: Job) -> None:
        if job in self.running:
            self.running.remove(job)
        elif job in self.waiting:
            self.waiting.remove(job)
        self.blocks.free(job)
        job.kv = KVLocation.NONE
