"""What ends jobs when something breaks: one job, one micro-batch, the workers, or all.

DESIGN: a serving engine loop never dies from one job. The engine's step catches
every failure at the narrowest scope that can be blamed and ends exactly the jobs
it touched, with reason "error" and a one-line message (the traceback goes to the
log, once):

- one job's step or sampling failed (a `JobFault` in place of its token): that job;
- an asynchronous KV copy failed: the job whose KV it moved;
- submitting, collecting or accounting a micro-batch raised: that micro-batch's
  jobs (and, when its copies may be half done, the jobs they moved);
- a worker died (`WorkerFailure`): every job whose KV or step lived in the
  workers; the rest keep their place and run on restarted workers, or, when the
  restart fails, the engine refuses new jobs and fails the rest;
- nothing to blame (the scheduler raised; the daemon gives up): every live job.

`EngineFailures` is a mixin of `fsd.engine.core.Engine`; it reads the engine's
state declared below and calls its `_release` and `_copies_done`.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fsd.engine.events import EventLog
from fsd.engine.executor import Executor, WorkerFailure
from fsd.engine.output import JobFault, RequestOutput, StepDelta, describe
from fsd.jobs import FinishReason, Job, KVLocation
from fsd.kv.swap import SwapOp
from fsd.sched.decision import SchedulerOutput
from fsd.sched.pipeline import InFlight
from fsd.sched.scheduler import Scheduler

if TYPE_CHECKING:
    from fsd.engine.detokenizer import JobDetokenizer

log = logging.getLogger("fsd.engine")


class EngineFailures(ABC):
    """Failing jobs at the narrowest scope: a job, a micro-batch, the workers, every job."""

    scheduler: Scheduler
    executor: Executor
    swapper: Any
    events: EventLog
    _jobs: dict[str, Job]
    _text: dict[str, JobDetokenizer]
    _flight: InFlight[Any]  # micro-batches in the pipeline (`.out` is their schedule)
    _degraded: str | None  # the last worker failure, as `degraded` says it
    _refusing: bool  # the workers could not be restarted: new jobs are refused
    worker_failures: int

    @abstractmethod
    def _release(self, job: Job) -> RequestOutput:
        """Forget a finished job and return its final output (the engine's)."""

    @abstractmethod
    def _copies_done(self, ops: list[SwapOp]) -> None:
        """Account asynchronous copies as ended (the engine's)."""

    @property
    def degraded(self) -> str | None:
        """Why the engine is not fully healthy; None when it is: once workers restarted
        after a failure have served a micro-batch (while new jobs are refused, never)."""
        if self._refusing or not self.executor.healthy:
            return self._degraded
        return None

    # ---- one job -----------------------------------------------------------------

    def _job_fault(self, job: Job, fault: JobFault, now: float) -> StepDelta:
        """One job's step failed on its own: end it; the batch's update() removes it."""
        log.error("job %s failed: %s%s", job.job_id, fault.message, _indent(fault.detail))
        return self._error_finish(job, fault.message, now)

    def _copies_failed(self) -> list[StepDelta]:
        """Fail the jobs whose asynchronous KV copy failed (their KV is lost)."""
        take = getattr(self.swapper, "take_failed", None)
        failed = take() if take is not None else []
        now = time.time()
        deltas = []
        for op, why in failed:
            job = op.job
            log.error("job %s: %s", job.job_id, why)
            if job.status.finished or job.job_id not in self._jobs:
                continue
            if job.job_id in self._flight.busy:  # its micro-batch frees its blocks on return
                deltas.append(self._error_finish(job, why, now))
            else:
                deltas.append(self._fail(job, why, now))
        return deltas

    def _fail(self, job: Job, reason: str, now: float) -> StepDelta:
        """End a job that no micro-batch in flight holds, freeing its blocks now."""
        self.scheduler.remove(job)
        return self._error_finish(job, reason, now)

    def _error_finish(self, job: Job, reason: str, now: float) -> StepDelta:
        """Finish a job with reason "error" and `reason` (the caller frees its blocks)."""
        job.finish(FinishReason.ERROR, now, error=reason)
        self.events.add(
            now, "finish", job, reason="error", error=reason, tokens=len(job.output_token_ids)
        )
        return StepDelta(job.job_id, (), "", self._release(job))

    # ---- one micro-batch ---------------------------------------------------------

    def _micro_batch_failed(
        self, out: SchedulerOutput, what: str, exc: Exception, copies: bool = False
    ) -> list[StepDelta]:
        """An unexpected exception while `what`: fail the micro-batch's jobs.

        `copies`: its KV copies may be half done, so the jobs they moved fail too.
        The other jobs, and the scheduler's other state, are untouched.
        """
        message = describe(f"{what} failed", exc)
        jobs = list(out.batch)
        if copies:
            jobs += [op.job for op in out.swap_out + out.swap_in]
        unique = list({id(job): job for job in jobs}.values())
        log.error(
            "%s; failing jobs %s",
            message,
            _ids(j for j in unique if not j.status.finished),
            exc_info=exc,
        )
        now = time.time()
        deltas = []
        busy = self._flight.busy
        for job in unique:
            if not job.status.finished:
                deltas.append(self._fail(job, message, now))
            elif job.job_id not in busy and self.scheduler.get(job.job_id) is job:
                self.scheduler.remove(job)  # finished or aborted: only the scheduler holds it
        return deltas

    # ---- the workers -------------------------------------------------------------

    def _workers_failed(
        self, exc: WorkerFailure, extra: SchedulerOutput | None = None
    ) -> list[StepDelta]:
        """A worker died: fail the jobs whose KV or step was lost, restart the workers.

        Lost: every micro-batch in flight (and `extra`, one whose submit failed) and
        every job's KV (device and host tiers live in the workers). Jobs that hold no
        KV yet keep their place and run on the fresh workers. If the restart fails the
        engine refuses new jobs and fails the rest; `degraded` says why either way.
        """
        now = time.time()
        self.worker_failures += 1
        lost = [mb.out for mb in self._flight.clear()] + ([extra] if extra is not None else [])
        in_lost = {j.job_id for out in lost for j in out.batch}
        for out in lost:  # their copies will never be reported: account them as ended
            self._copies_done([op for op in out.swap_out + out.swap_in if not op.sync])
        reason = f"worker failure: {exc}"
        log.error("%s; failing the jobs whose KV was lost and restarting the workers", reason)
        doomed = []
        for job in self.scheduler.jobs():
            if job.status.finished:  # aborted while in flight: only the scheduler holds it
                self.scheduler.remove(job)
            elif job.job_id in in_lost or job.kv is not KVLocation.NONE or job.num_computed_tokens:
                doomed.append(job)
        deltas = [self._fail(job, reason, now) for job in doomed]
        try:
            self.executor.restart()
        except Exception as restart_exc:  # noqa: BLE001 - reported, never raised into the loop
            self._refusing = True
            self._degraded = (
                f"{reason} ({len(doomed)} jobs failed); restarting the workers failed: "
                f"{restart_exc}; new requests are refused"
            )
            log.error("%s", self._degraded)
            return deltas + [self._fail(job, reason, now) for job in self.scheduler.jobs()]
        n = self.worker_failures
        self._degraded = (
            f"{reason} at {time.strftime('%H:%M:%S', time.localtime(now))} "
            f"({len(doomed)} jobs failed); workers restarted "
            f"({n} time{'s' if n > 1 else ''}), serving"
        )
        log.warning("%s", self._degraded)
        return deltas

    def _check_workers(self) -> list[StepDelta] | None:
        """Before a micro-batch: workers that died while idle are found and restarted
        now, before a job runs on them (the deltas of jobs whose KV died with them;
        None if all is well)."""
        if self._flight:
            return None
        try:
            self.executor.check()
        except WorkerFailure as exc:
            return self._workers_failed(exc)
        return None

    # ---- every job -----------------------------------------------------------------

    def fail_all(self, reason: str) -> list[StepDelta]:
        """End every live job with reason "error" and `reason`; return their last deltas.

        The last resort when no single job or batch is to blame (the scheduler
        raised; the daemon gives up); the caller logs why. A job inside a micro-batch
        still in flight ends now and its blocks return when the micro-batch comes back.
        """
        now = time.time()
        busy = self._flight.busy
        deltas = []
        for job in list(self._jobs.values()):
            try:
                if job.job_id not in busy:
                    self.scheduler.remove(job)
            except Exception:  # noqa: BLE001 - end the job even if its blocks are lost
                log.exception("could not free the KV blocks of job %s", job.job_id)
            try:
                deltas.append(self._error_finish(job, reason, now))
            except Exception:  # noqa: BLE001 - forget it all the same: no job outlives this
                log.exception("could not finish job %s", job.job_id)
                self._jobs.pop(job.job_id, None)
                self._text.pop(job.job_id, None)
        for job in self.scheduler.jobs():  # finished, only the scheduler holds it
            if job.job_id not in busy:
                try:
                    self.scheduler.remove(job)
                except Exception:  # noqa: BLE001 - nothing left to fail
                    log.exception("could not free the KV blocks of job %s", job.job_id)
        return deltas

    def _fail_all_after(self, reason: str, exc: Exception) -> list[StepDelta]:
        log.error("%s; failing every live job: %s", reason, _ids(self._jobs), exc_info=exc)
        return self.fail_all(reason)


def _ids(jobs: Iterable[Job | str], limit: int = 20) -> str:
    """Job ids for a log line, the first `limit` of them."""
    ids = [j if isinstance(j, str) else j.job_id for j in jobs]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return (", ".join(ids[:limit]) or "(none)") + more


def _indent(detail: str) -> str:
    """A traceback as a continuation of a log line ("" when there is none)."""
    return "\n" + detail.rstrip() if detail else ""
