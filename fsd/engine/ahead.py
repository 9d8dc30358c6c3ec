"""Scheduling one step ahead: the host lays out step N+1 while the device runs step N.

Why: between two steps the device idles while the host collects tokens, streams
text, accounts the iteration, schedules and lays out the next batch. vLLM v1 and
SGLang hide that work by deciding the next batch before the current one's tokens
are back; so does this module, for one micro-batch at a time (tp = pp = 1).

How. A step (`step_ahead`) submits the next batch, then collects the one before it
(waiting for the device only now, with the next batch already queued behind it),
then `settle`s the batch just submitted: each job that samples is given a token
still to come (`Job.expect_token`) and the scheduler accounts the iteration as if
it had ended, so the next schedule sees every job one token on. A job in two
batches in a row feeds the pending token from the device (`StepPlan.pending`).
When the tokens come, `resolve` writes them in, streams their text and ends the
jobs that stop. A job that stops on a token still being drawn (EOS, a stop string)
has run one step more: that step's token is dropped with it. A length limit is
known without the token, so such a job ends at `settle` and is never scheduled past it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from fsd.engine.executor import StepResult
from fsd.engine.flight import MicroBatch
from fsd.engine.output import JobFault, StepDelta, describe
from fsd.jobs import PENDING, Job

if TYPE_CHECKING:
    from fsd.engine.events import EventLog
    from fsd.sched.decision import SchedulerOutput
    from fsd.sched.pipeline import InFlight
    from fsd.sched.scheduler import Scheduler


class Engine(Protocol):
    """What scheduling ahead uses of the engine (fsd.engine.core.Engine): its step's
    parts, its bookkeeping and its failure paths (fsd.engine.failures)."""

    scheduler: Scheduler
    events: EventLog
    eos_ids: frozenset[int]
    max_model_len: int
    measure_cost: bool
    _jobs: dict[str, Job]
    _flight: InFlight[MicroBatch]

    def _copies_ended(self) -> list[StepDelta]: ...
    def _submit_next(self) -> list[StepDelta] | None: ...
    def _collect(self, wait: bool) -> list[StepDelta]: ...
    def _idle(self, deltas: list[StepDelta]) -> None: ...
    def _emit(self, job: Job, token: int, now: float) -> StepDelta: ...
    def _iterated(self, mb: MicroBatch, now: float) -> None: ...
    def _job_fault(self, job: Job, fault: JobFault, now: float) -> StepDelta: ...
    def _fail(self, job: Job, reason: str, now: float) -> StepDelta: ...
    def _micro_batch_failed(
        self, out: SchedulerOutput, what: str, exc: Exception, copies: bool = False
    ) -> list[StepDelta]: ...


def step_ahead(engine: Engine) -> list[StepDelta]:
    """One step: submit the next batch, collect the previous, settle the next."""
    early = engine._copies_ended() or engine._submit_next()  # failed copies, or jobs
    if early is not None:  # failed submitting: theirs are the step's deltas
        return early
    flight, deltas = engine._flight, []
    if flight and flight.settled(flight.oldest()):
        before = flight.oldest()
        deltas = engine._collect(wait=True)
        if flight:  # it ran while the device finished the one before: timed from then
            after = flight.newest()
            after.submitted = max(after.submitted, before.returned)
    if flight and not flight.settled(newest := flight.newest()):
        try:
            settle(engine, newest)
        except Exception as exc:  # noqa: BLE001 - this micro-batch's jobs fail
            return deltas + _settle_failed(engine, newest, exc)
    engine._idle(deltas)
    return deltas


def settle(engine: Engine, mb: MicroBatch) -> None:
    """Account `mb` now, its tokens still to come, so the next batch can be scheduled."""
    out, now = mb.out, time.time()
    for job in out.batch:
        if job.status.finished:  # aborted or failed since it was scheduled
            continue
        if not job.step_samples:  # a prefill chunk short of the end
            job.absorb_chunk()
            continue
        job.expect_token(now)
        reason, _ = job.stop_after(PENDING, engine.eos_ids, engine.max_model_len)
        if reason is not None:  # the length: whatever the token, it is the last
            job.finish(reason, now)  # update() below frees it; `resolve` ends its text
    engine.scheduler.update(out, now)
    engine.events.demoted(out.demoted, now)
    engine._flight.settle(mb)


def _settle_failed(engine: Engine, mb: MicroBatch, exc: Exception) -> list[StepDelta]:
    """Accounting `mb` failed: its jobs fail (its tokens, when they come, are dropped)."""
    engine._flight.settle(mb)
    batch = mb.out.batch
    ended = [j for j in batch if j.status.finished and j.job_id in engine._jobs]  # at the length
    for job in batch:
        job.drop_pending()
    deltas = engine._micro_batch_failed(mb.out, "accounting the step", exc)
    why, now = describe("accounting the step failed", exc), time.time()
    return deltas + [engine._fail(job, why, now) for job in ended]


def resolve(engine: Engine, mb: MicroBatch, result: StepResult) -> list[StepDelta]:
    """`mb`'s tokens came: write them in, stream them, end the jobs that stop."""
    now, busy, deltas = time.time(), engine._flight.busy, []
    for job, token in zip(mb.out.batch, result.tokens, strict=True):
        if not job.pending:  # it drew nothing (a chunk), or ended meanwhile
            continue
        if isinstance(token, JobFault):
            deltas.append(engine._job_fault(job, token, now))
        else:
            try:
                job.resolve_token(token, now)
                deltas.append(engine._emit(job, token, now))
            except Exception as exc:  # noqa: BLE001 - this job alone fails
                deltas.append(engine._job_fault(job, JobFault.of("appending its token", exc), now))
        if job.status.finished and job.job_id not in busy:  # else the next batch frees it
            engine.scheduler.remove(job)  # (a no-op for one `settle` ended)
    if engine.measure_cost:
        mb.report(engine.scheduler, result.tokens)
    engine._iterated(mb, now)
    return deltas
