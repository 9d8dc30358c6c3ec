"""A micro-batch in flight, and the engine's side of live cost (fsd.cost.calibration).

Why the engine measures: the scheduler charges service in the cost model's seconds,
fitted at start-up. Each collected micro-batch reports what the model predicted for
it and how long it really took, so the scheduler can charge measured seconds.

What is measured: from handing the batch to the executor (its synchronous KV copies,
the model step and sampling) to its tokens coming back; scheduling and streaming
are not the iteration's cost. With pipeline parallelism that is the micro-batch's
latency through every stage, and the prediction it is compared with is too
(`Scheduler.predicted_iteration_time`): both are in the same units, and only
their ratio is used.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from fsd.engine.output import JobFault
from fsd.sched.decision import SchedulerOutput
from fsd.sched.scheduler import Scheduler


@dataclass
class MicroBatch:
    """A submitted batch whose tokens have not come back yet."""

    ticket: int
    out: SchedulerOutput
    start: float
    prefills: int
    prefill_tokens: int
    predicted: float = 0.0  # the cost model's seconds for it, through every stage
    submitted: float = 0.0  # perf_counter() when the executor got it
    returned: float = 0.0  # perf_counter() when its result was collected

    def collected(self) -> None:
        """Its result is here: the iteration's measured time ends now."""
        self.returned = time.perf_counter()

    def report(self, scheduler: Scheduler, tokens: Sequence[object]) -> None:
        """Tell the scheduler how long the iteration took against its prediction.

        Not when a job's step failed on its own: the batch was then re-run in halves
        (fsd.engine.executor), and its time says nothing of the batch's cost.
        """
        if not self.out.batch or not self.submitted or not self.returned:
            return
        if any(isinstance(t, JobFault) for t in tokens):
            return
        scheduler.observe_iteration(self.predicted, self.returned - self.submitted)
