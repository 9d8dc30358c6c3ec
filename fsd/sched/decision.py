"""What the scheduler decides each iteration and shows of itself: plain records that
the engine, the simulator and telemetry read (a leaf: no scheduling code here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fsd.jobs import Job, JobStatus
from fsd.kv.swap import SwapOp
from fsd.sched.lengths import LearnedLengths
from fsd.sched.queues import LevelView

if TYPE_CHECKING:
    from fsd.cost.calibration import LiveCost
    from fsd.sched.queues import JobQueue


@dataclass
class SchedulerOutput:
    """One iteration's decision: the batch, the copies to make, what changed."""

    batch: list[Job] = field(default_factory=list)
    swap_out: list[SwapOp] = field(default_factory=list)
    swap_in: list[SwapOp] = field(default_factory=list)
    sync: list[SwapOp] = field(default_factory=list)  # the synchronous ones, in issue order
    cache_copies: list[SwapOp] = field(default_factory=list)  # the prefix cache's (no job)
    preempted: list[Job] = field(default_factory=list)  # ran last iteration, not this one
    recomputed: list[Job] = field(default_factory=list)  # KV dropped this iteration
    promoted: list[Job] = field(default_factory=list)
    demoted: list[Job] = field(default_factory=list)  # filled by update()

    @property
    def num_tokens(self) -> int:
        return sum(j.step_tokens for j in self.batch)

    @property
    def sync_ops(self) -> list[SwapOp]:
        """Copies that must end before the model step, to be made in this order.

        Each one's source blocks were freed when it was issued, so a later copy may
        write them (a swap-out into the host blocks a swap-in just left, or the
        reverse on the device): any other order can overwrite KV before it is read.
        """
        return list(self.sync)

    def mark_preempted(self, job: Job) -> None:
        """`job` ran last iteration and not in this one."""
        job.preemptions += 1
        if job.status is JobStatus.RUNNING:
            job.status = JobStatus.PREEMPTED
        self.preempted.append(job)

    def record(self, op: SwapOp) -> None:
        """A copy the block manager started for this iteration."""
        job = op.job
        if job is None:  # the prefix cache's (always synchronous)
            self.cache_copies.append(op)
            self.sync.append(op)
            return
        if op.direction == "out":
            job.swaps_out += 1
            self.swap_out.append(op)
        else:
            job.swaps_in += 1
            self.swap_in.append(op)
        if op.sync:  # the executor completes it before the step
            self.sync.append(op)


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler's state as telemetry shows it."""

    policy: str
    levels: list[LevelView]
    quanta: list[float]
    starve_limit: float | None
    starve_limit_waiting: float | None
    reserve: int  # device blocks the KV policy keeps free for arrivals
    live_cost: float = 1.0  # measured / predicted iteration time (fsd.cost.calibration)
    live_cost_samples: int = 0  # iterations it was learned from (0: the profile as is)
    learned: LearnedLengths | None = None  # output lengths learned from finished jobs

    @classmethod
    def of(
        cls, queue: JobQueue, reserve: int, live: LiveCost, with_levels: bool = True
    ) -> SchedulerStats:
        """A queue's figures (`with_levels` False: without the levels' job lists, a walk
        of every queued job)."""
        quanta, starve, waiting = queue.limits()
        levels = queue.levels() if with_levels else []
        return cls(
            queue.name, levels, quanta, starve, waiting, reserve, live.scale, live.samples,
            queue.learned(),
        )  # fmt: skip
