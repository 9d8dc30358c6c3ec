"""The engine: admits jobs, runs iterations, streams tokens, finishes jobs.

One `step()` is one iteration of the heartbeat in DESIGN.md §1: schedule, run the
model on the batch, append and stream the sampled tokens, then let the policy
account the iteration. Everything about *which* jobs run lives in the scheduler;
*where* the model runs is the executor's business (fsd.engine.executor): in process,
or tensor x pipeline parallel on Ray. The step function is chosen once, as vLLM's
EngineCore does: with one micro-batch in flight at most (pp = 1) a step schedules,
runs and collects one batch; scheduled one step ahead (fsd.engine.ahead) it submits
the next batch before collecting the one the device runs; with pipeline parallelism up
to `pp` micro-batches are in flight, and a step submits the next one (of jobs not in
flight) and collects the oldest. Failures: fsd.engine.failures; `history` feeds fsd.twin.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from fsd.admission import JobRequest, RequestLimits, admit, refuse_late
from fsd.config import EngineConfig
from fsd.cost import CostModel
from fsd.engine.ahead import resolve, step_ahead
from fsd.engine.detokenizer import JobDetokenizer
from fsd.engine.events import EventLog
from fsd.engine.executor import StepResult, WorkerFailure
from fsd.engine.executor_factory import make_executor
from fsd.engine.failures import EngineFailures
from fsd.engine.flight import MicroBatch
from fsd.engine.history import WorkHistory
from fsd.engine.live_settings import logged, retuned
from fsd.engine.output import IterationStats, JobFault, RequestOutput, StepDelta, describe
from fsd.engine.profiler import calibrate
from fsd.errors import ConfigError, OverloadedError, UnknownJobError
from fsd.jobs import FinishReason, Job, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.kv.swap import SwapOp
from fsd.sched.decision import SchedulerOutput
from fsd.sched.pipeline import InFlight
from fsd.sched.registry import check_policies, make_scheduler
from fsd.sched.slo import default_slo

log = logging.getLogger("fsd.engine")


class Engine(EngineFailures):
    """A model, its paged KV pool, a scheduling policy and the jobs in flight."""

    def __init__(self, config: EngineConfig, cost: CostModel | None = None) -> None:
        """`cost`: a ready cost model; otherwise config.sched.profile or a quick calibration.

        A profile loaded or measured here is recalibrated from the iterations the engine
        times (service is charged in measured seconds: fsd.engine.flight); a `cost`
        handed in is charged as given (`measure_cost` False), so a test can pin levels.
        """
        check_policies(config.sched, config.cache)  # fail on a bad name before loading weights
        self.config = config
        self.executor = ex = make_executor(config)
        self.loaded = ex.loaded
        self.tokenizer = self.loaded.tokenizer
        self.eos_ids = frozenset(self.tokenizer.eos_token_ids)
        self.device = self.loaded.device
        self.max_model_len = self.loaded.max_model_len
        if hasattr(ex, "pool"):  # in process: the KV tensors themselves (tests look inside)
            self.pool, self.host_pool = ex.pool, ex.host_pool
        self.swapper = ex.swapper
        self.blocks = BlockManager(ex.num_device_blocks, config.cache.block_size, ex.num_host_blocks)
        self._flight: InFlight[MicroBatch] = InFlight()
        # chosen once: one batch at a time, one scheduled ahead, or a pipeline of them
        ahead = functools.partial(step_ahead, self) if getattr(ex, "ahead", False) else None
        self._step_fn = self._step_pipelined if ex.max_in_flight > 1 else ahead or self._step_one
        self._degraded: str | None = None  # the last worker failure (`degraded`)
        self._refusing, self.worker_failures = False, 0  # refusing: workers not restarted
        try:
            self.cost = cost or self._cost_model()
        except BaseException:
            ex.close()
            raise
        self.scheduler = make_scheduler(config.sched, config.cache, self.blocks, self.cost)
        self.measure_cost = cost is None
        self._jobs: dict[str, Job] = {}
        self._text: dict[str, JobDetokenizer] = {}
        self.last_iteration: IterationStats | None = None
        self.recent_iterations: deque[IterationStats] = deque(maxlen=128)
        self.events = EventLog()
        self.history = WorkHistory(time.time())  # arrivals, lengths: the twin's (fsd.twin)
        self.last_schedule: SchedulerOutput | None = None
        self.iterations = 0
        self.refused_late = 0  # requests refused as predicted to miss the SLO (refuse_late)

    # ---- admission -------------------------------------------------------------

    @property
    def limits(self) -> RequestLimits:
        """What bounds one request here now (fsd.admission)."""
        return RequestLimits(
            self.max_model_len,
            self.config.sched.max_batch_tokens,
            self.blocks.device.num_blocks,
            self.blocks.block_size,
            self.scheduler.prefill_budget,
            self.loaded.arch.context_note(self.max_model_len),
        )

    def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
        tags: Sequence[str] = (),
        clip: bool = True,
        owner: str | None = None,  # whose job (the turns of fsd.sched.fair_share)
    ) -> Job:
        """Admit and queue one request; raise a clear FsdError on bad input (`clip`
        False: a max_tokens past the context is refused, not cut to it)."""
        params = SamplingParams() if params is None else params
        return self.enqueue(JobRequest(prompt, params, request_id, arrival_time, tags, clip, owner=owner))

    def enqueue(self, request: JobRequest) -> Job:
        """Queue one request: admitted here (fsd.admission) unless it already was where
        it entered (a replica's, by the cluster face), which this engine trusts."""
        if self._refusing:
            raise WorkerFailure(f"the engine is not serving: {self.degraded}")
        vocab, r = self.loaded.arch.vocab_size, request
        r = r if r.admitted else admit(r, self.limits, self.tokenizer, vocab)
        if r.job_id is not None and r.job_id in self._jobs:
            raise ConfigError(f"request id {r.job_id!r} is already in use")
        job = Job(
            prompt_token_ids=list(r.ids),
            params=r.params,
            prompt=r.prompt if isinstance(r.prompt, str) else None,
            arrival_time=time.time() if r.arrival is None else r.arrival,
            max_output=r.max_output,
            tags=tuple(r.tags),
            owner=r.owner,
        )
        if r.job_id is not None:
            job.job_id = r.job_id
        self.scheduler.add(job, job.arrival_time)
        self._refuse_if_late(job)
        self._jobs[job.job_id] = job  # its detokenizer comes with its first token (`_append`)
        self.history.arrived(job.arrival_time)
        self.events.add(job.arrival_time, "arrive", job, prompt_tokens=len(r.ids), level=job.level)
        return job

    def _refuse_if_late(self, job: Job) -> None:
        """With refuse_wait or refuse_late set, take back a job just queued that is
        predicted to wait or run too long, and say so (fsd.admission)."""
        now = time.time()
        try:
            refuse_late(self.scheduler, job, now, default_slo(self.cost))
        except OverloadedError:
            self.scheduler.remove(job)
            self.refused_late += 1
            self.events.add(now, "refuse", job)
            raise

    def _cost_model(self) -> CostModel:
        """The profile that service is charged in: loaded, or measured quickly now."""
        cost = calibrate(self, self.config.sched.profile)
        pp = self.config.parallel.pp
        if pp > 1 and cost.pipeline_stages == 1:  # a micro-batch may start each 1/pp of it
            cost = dataclasses.replace(cost, pipeline_stages=pp)
        return cost

    def abort(self, job_id: str) -> RequestOutput:
        """End a job now; its blocks return to the pool."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJobError(f"no job with id {job_id!r}")
        if job_id not in self._flight.busy:  # else its micro-batch's update() removes it
            self.scheduler.remove(job)  # (a no-op if it ended on a token still drawn)
        job.finish(FinishReason.ABORT, time.time())
        self.events.add(job.finish_time or 0.0, "abort", job, tokens=len(job.output_token_ids))
        return self._release(job)

    # ---- live settings ---------------------------------------------------------

    def retune(self, **changes: Any) -> EngineConfig:
        """Change scheduling settings between iterations (fsd.engine.live_settings)."""
        self.config = retuned(self.config, self.scheduler, changes)
        self.events.add(time.time(), "retune", None, **logged(changes))
        return self.config

    # ---- the iteration ---------------------------------------------------------

    def has_unfinished(self) -> bool:  # (a batch settled ahead of its tokens has given all)
        return bool(self._jobs) or any(not self._flight.settled(mb) for mb in self._flight)

    def get(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJobError(f"no job with id {job_id!r}")
        return job

    def _copies_done(self, ops: list[SwapOp]) -> None:
        now = time.time()
        for op in ops:
            self.scheduler.swap_done(op)
            self.events.swap(op, now, "end")

    def step(self) -> list[StepDelta]:
        """Run one iteration (`_step_one` or `_step_pipelined`, chosen at start); return
        what each job in the collected batch produced.

        Never raises (DESIGN: the loop never dies from one job). A job whose sampling
        or model step fails on its own ends with reason "error" and the rest of its
        batch goes on; an unexpected exception while submitting or collecting a
        micro-batch fails that micro-batch's jobs; one with no batch to blame (the
        scheduler's) fails every live job, lest it repeat on every step. Each is
        logged once, with its traceback (fsd.engine.failures)."""
        try:
            return self._step_fn()
        except Exception as exc:  # noqa: BLE001 - last resort: the loop must go on
            try:
                return self._fail_all_after(describe("the engine step failed", exc), exc)
            except Exception:  # noqa: BLE001 - fail_all frees what it can, job by job
                log.exception("failing the live jobs failed too")
                return []

    def _step_one(self) -> list[StepDelta]:
        """pp = 1: schedule a batch, run it, collect its tokens."""
        ended = self._copies_ended()
        if ended:
            return ended
        failed = self._submit_next()
        if failed is not None:
            return failed
        deltas = self._collect(wait=True) if self._flight else []
        self._idle(deltas)
        return deltas

    def _step_pipelined(self) -> list[StepDelta]:
        """pp > 1: submit the next micro-batch while a slot is free, then collect the
        oldest, waiting for it only when the pipeline is full or nothing was submitted."""
        ended = self._copies_ended()
        if ended:
            return ended
        submitted = False
        if len(self._flight) < self.executor.max_in_flight:
            before = len(self._flight)
            failed = self._submit_next()
            if failed is not None:
                return failed
            submitted = len(self._flight) > before
        deltas: list[StepDelta] = []
        if self._flight:
            full = len(self._flight) >= self.executor.max_in_flight
            deltas = self._collect(wait=full or not submitted)
        self._idle(deltas)
        return deltas

    def _copies_ended(self) -> list[StepDelta]:
        """Account the copies that ended; the deltas of jobs whose copy failed."""
        self._copies_done(self.swapper.poll())
        return self._copies_failed()

    def _idle(self, deltas: list[StepDelta]) -> None:
        if not deltas and not self._flight and self.swapper.busy:  # only copies: block, not spin
            self._copies_done(self.swapper.wait(timeout=0.05))

    def _submit_next(self) -> list[StepDelta] | None:
        """Schedule and submit the next micro-batch; the deltas of jobs failed doing so."""
        if (lost := self._check_workers()) is not None:  # (fsd.engine.failures)
            return lost
        start = time.time()
        try:
            out = self.scheduler.schedule(start, busy=self._flight.busy)
        except Exception as exc:  # noqa: BLE001 - no batch to blame: end every job
            return self._fail_all_after(describe("the scheduler failed", exc), exc)
        self.last_schedule = out
        async_ops = [op for op in out.swap_out + out.swap_in if not op.sync]
        try:
            self.events.schedule(out, start)
            if out.batch or out.sync_ops or async_ops:
                prefills = [j for j in out.batch if j.step_tokens > 1]
                predicted, sent = self.scheduler.predicted_iteration_time, time.perf_counter()
                ticket = self.executor.submit(out.batch, out.sync_ops, async_ops)
                n_tokens = sum(j.step_tokens for j in prefills)
                mb = MicroBatch(ticket, out, start, len(prefills), n_tokens, predicted, sent)
                self._flight.push(mb)
        except WorkerFailure as exc:
            return self._workers_failed(exc, extra=out)
        except Exception as exc:  # noqa: BLE001 - this micro-batch's jobs fail
            # submit raised before its copies started: none will be reported
            self._copies_done(async_ops)
            return self._micro_batch_failed(out, "submitting the step", exc, copies=True)
        return None

    def _collect(self, wait: bool) -> list[StepDelta]:
        """Finish the oldest micro-batch if it is done (or once it is, with `wait`)."""
        mb = self._flight.oldest()
        try:
            result = self.executor.result(mb.ticket, None if wait else 0.0)
        except WorkerFailure as exc:
            return self._workers_failed(exc)
        except Exception as exc:  # noqa: BLE001 - this micro-batch's jobs fail
            self._flight.pop()
            if self.executor.copies_end_with_result:  # they ended, but unreported
                self._copies_done([op for op in mb.out.swap_out + mb.out.swap_in if not op.sync])
            return self._micro_batch_failed(mb.out, "collecting the step", exc)
        if result is None:
            return []
        mb.collected()  # (the measured iteration ends: fsd.engine.flight)
        settled = self._flight.settled(mb)  # accounted already (fsd.engine.ahead)
        self._flight.pop()
        try:
            self._copies_done(result.swaps_done)
            if not mb.out.batch:
                return []
            return resolve(self, mb, result) if settled else self._finish_step(mb, result)
        except Exception as exc:  # noqa: BLE001 - this micro-batch's jobs fail
            return self._micro_batch_failed(mb.out, "finishing the step", exc)

    def _finish_step(self, mb: MicroBatch, result: StepResult) -> list[StepDelta]:
        out = mb.out
        now = time.time()
        deltas = []
        for job, tok in zip(out.batch, result.tokens, strict=True):
            if job.status.finished:  # aborted while its micro-batch was in flight
                continue
            if isinstance(tok, JobFault):
                deltas.append(self._job_fault(job, tok, now))
                continue
            if not job.step_samples:  # a prefill chunk short of the end: KV filled, no token
                job.absorb_chunk()
                continue
            try:
                deltas.append(self._append(job, tok, now))
            except Exception as exc:  # noqa: BLE001 - this job alone fails
                deltas.append(self._job_fault(job, JobFault.of("appending its token", exc), now))
        try:  # the batch's jobs have their deltas: keep them whatever happens now
            if self.measure_cost:  # charged in measured seconds from now on
                mb.report(self.scheduler, result.tokens)
            self.scheduler.update(out, now)
            self.events.demoted(out.demoted, now)
        except Exception as exc:  # noqa: BLE001 - the scheduler's state for them is lost
            return deltas + self._micro_batch_failed(out, "accounting the step", exc)
        self._iterated(mb, now)
        return deltas

    def _iterated(self, mb: MicroBatch, now: float) -> None:
        self.iterations += 1
        n = len(mb.out.batch)
        stats = IterationStats(mb.start, now - mb.start, n, mb.prefill_tokens, n - mb.prefills)
        self.last_iteration = stats
        self.recent_iterations.append(stats)

    def _append(self, job: Job, token: int, now: float) -> StepDelta:
        """The job produced `token`: record it, then `_emit`."""
        job.append_token(token, now)
        return self._emit(job, token, now)

    def _emit(self, job: Job, token: int, now: float) -> StepDelta:
        """Stream the text of the token the job just produced; end it if it stops."""
        text = self._text.get(job.job_id)
        if text is None:  # made for its first token: a queued job holds none (~300 B)
            text = JobDetokenizer(self.tokenizer, job.prompt_token_ids, job.params.stop)
            self._text[job.job_id] = text
        delta = text.add(token)
        if text.stop is not None:
            reason, stop = FinishReason.STOP, text.stop
        else:
            reason, stop = job.stop_after(token, self.eos_ids, self.max_model_len)
        final = None
        if reason is not None:
            delta += text.finish()
            if text.stop is not None:  # found only in the text released at the end
                reason, stop = FinishReason.STOP, text.stop
            job.finish(reason, now, stop)
            self.events.add(
                now, "finish", job, reason=reason.value, tokens=len(job.output_token_ids)
            )
            final = self._release(job)
        return StepDelta(job.job_id, (token,), delta, final)

    def _release(self, job: Job) -> RequestOutput:
        job.drop_pending()  # it ended before its last token came: not its
        self.history.ended(job)
        self._jobs.pop(job.job_id, None)
        text = self._text.pop(job.job_id, None)  # None: no token yet, or released mid-failure
        self.executor.forget(job.job_id)
        return RequestOutput.of(job, text.text if text is not None else "")

    def output(self, job: Job) -> RequestOutput:
        """The result so far of a job (finished or not)."""
        return RequestOutput.of(job, getattr(self._text.get(job.job_id), "text", ""))

    def close(self) -> None:
        """Stop the workers and copy threads, their memory freed (the engine cannot run after)."""
        self._flight.clear()
        self.pool = self.host_pool = None
        self.executor.close()
