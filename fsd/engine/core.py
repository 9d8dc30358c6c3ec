"""The engine: admits jobs, runs iterations, streams tokens, finishes jobs.

One `step()` is one iteration of the heartbeat in DESIGN.md §1: schedule, run the
model on the batch, append and stream the sampled tokens, then let the policy
account the iteration. Everything about *which* jobs run lives in the scheduler;
*where* the model runs is the executor's business (fsd.engine.executor): in process,
or tensor x pipeline parallel on Ray. With pipeline parallelism up to `pp`
micro-batches are in flight: a step submits the next one (its jobs chosen from
those not already in flight) and collects the oldest.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fsd.config import EngineConfig, SchedConfig
from fsd.engine.events import EventLog
from fsd.engine.executor import StepResult, WorkerFailure, make_executor
from fsd.engine.output import JobFault, RequestOutput, StepDelta, describe
from fsd.engine.text import JobText
from fsd.errors import ConfigError, PromptTooLongError, UnknownJobError
from fsd.jobs import FinishReason, Job, KVLocation, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.kv.swap import SwapOp
from fsd.sched.profile import CostModel
from fsd.sched.registry import make_scheduler, resolve_policy
from fsd.sched.scheduler import SchedulerOutput

log = logging.getLogger("fsd.engine")


@dataclass(frozen=True)
class IterationStats:
    """What one iteration did (kept for benches and telemetry)."""

    start: float
    duration: float
    batch_size: int
    prefill_tokens: int
    decode_tokens: int


@dataclass
class _MicroBatch:
    """A submitted batch whose tokens have not come back yet."""

    ticket: int
    out: SchedulerOutput
    start: float
    prefills: int
    prefill_tokens: int


class Engine:
    """A model, its paged KV pool, a scheduling policy and the jobs in flight."""

    def __init__(self, config: EngineConfig, cost: CostModel | None = None) -> None:
        """`cost`: a ready cost model; otherwise config.sched.profile or a quick calibration."""
        _engine_policy(config.sched.policy)  # fail on a bad policy before loading weights
        self.config = config
        self.executor = make_executor(config)
        ex = self.executor
        self.loaded = ex.loaded
        self.tokenizer = self.loaded.tokenizer
        self.eos_ids = frozenset(self.tokenizer.eos_token_ids)
        self.device = self.loaded.device
        self.max_model_len = self.loaded.max_model_len
        if hasattr(ex, "pool"):  # in process: the KV tensors themselves (tests look inside)
            self.pool = ex.pool
            self.host_pool = ex.host_pool
        self.swapper = ex.swapper
        self.sampler = ex.sampler
        self.runner = ex.runner
        self.blocks = BlockManager(
            ex.num_device_blocks, config.cache.block_size, ex.num_host_blocks
        )
        self._in_flight: deque[_MicroBatch] = deque()
        # why the engine is not fully healthy (a worker died); None when it is
        self.degraded: str | None = None
        self._refusing = False  # the workers could not be restarted: new jobs are refused
        self.worker_failures = 0
        try:
            self.cost = cost or self._cost_model()
        except BaseException:
            ex.close()
            raise
        self.scheduler = make_scheduler(config.sched, config.cache, self.blocks, self.cost)
        self._jobs: dict[str, Job] = {}
        self._text: dict[str, JobText] = {}
        self.last_iteration: IterationStats | None = None
        self.recent_iterations: deque[IterationStats] = deque(maxlen=128)
        self.events = EventLog()
        self.last_schedule: SchedulerOutput | None = None
        self.iterations = 0

    # ---- admission -------------------------------------------------------------

    def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
        tags: Sequence[str] = (),
    ) -> Job:
        """Validate and queue one request; raise a clear FsdError on bad input."""
        if self._refusing:
            raise WorkerFailure(f"the engine is not serving: {self.degraded}")
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ConfigError(f"params must be a SamplingParams, got {type(params).__name__}")
        vocab = self.loaded.arch.vocab_size
        bad = [t for t in params.stop_token_ids if t >= vocab]
        if bad:  # an id past the logits would fail the job's every sampling step
            raise ConfigError(
                f"stop_token_ids must be below the model's vocabulary size {vocab}, got {bad[:5]}"
            )
        text = prompt if isinstance(prompt, str) else None
        ids = self._prompt_ids(prompt)
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"prompt has {len(ids)} tokens; the model's context is {self.max_model_len} "
                "tokens and at least one must be left for output"
            )
        if len(ids) > self.config.sched.max_batch_tokens:
            raise PromptTooLongError(
                f"prompt has {len(ids)} tokens, more than max_batch_tokens "
                f"({self.config.sched.max_batch_tokens}) allows in one iteration"
            )
        max_output = min(params.max_tokens, self.max_model_len - len(ids))
        need = self.blocks.blocks_for(len(ids) + max_output)
        if need > self.blocks.device.num_blocks:
            raise PromptTooLongError(
                f"prompt of {len(ids)} tokens plus {max_output} output tokens needs {need} KV "
                f"blocks; the device pool has {self.blocks.device.num_blocks}"
            )
        if request_id is not None and request_id in self._jobs:
            raise ConfigError(f"request id {request_id!r} is already in use")
        job = Job(
            prompt_token_ids=ids,
            params=params,
            prompt=text,
            arrival_time=time.time() if arrival_time is None else arrival_time,
            max_output=max_output,
            tags=tuple(tags),
        )
        if request_id is not None:
            job.job_id = request_id
        self._jobs[job.job_id] = job
        self._text[job.job_id] = JobText(self.tokenizer, ids, params.stop)
        self.scheduler.add(job, job.arrival_time)
        self.events.add(job.arrival_time, "arrive", job, prompt_tokens=len(ids), level=job.level)
        return job

    def _cost_model(self) -> CostModel:
        """The profile that service is charged in: loaded, or measured quickly now."""
        from fsd.engine.profiler import calibrate

        cost = calibrate(self, self.config.sched.profile)
        pp = self.config.parallel.pp
        if pp > 1 and cost.pipeline_stages == 1:
            # measured through every stage: a new micro-batch can start each 1/pp of it
            cost = dataclasses.replace(cost, pipeline_stages=pp)
        return cost

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
            vocab = self.loaded.arch.vocab_size
            bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise ConfigError(f"token ids must be ints in [0, {vocab}); got {bad[:5]}")
        if not ids:
            raise ConfigError("the prompt is empty")
        return ids

    def abort(self, job_id: str) -> RequestOutput:
        """End a job now; its blocks return to the pool."""
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJobError(f"no job with id {job_id!r}")
        if job_id not in self._busy():  # else its micro-batch's update() removes it
            self.scheduler.remove(job)
        job.finish(FinishReason.ABORT, time.time())
        self.events.add(job.finish_time or 0.0, "abort", job, tokens=len(job.output_token_ids))
        return self._release(job)

    # ---- live settings ---------------------------------------------------------

    RETUNABLE_CACHE = ("kv_policy", "reserve_min_jobs", "reserve_top_levels", "admit_fraction")

    def retune(self, **changes: Any) -> EngineConfig:
        """Change scheduling settings between iterations without losing a job.

        Accepts SchedConfig fields (policy, quanta, q1, quantum_ratio, num_levels,
        starve_limit, starve_promote, demote_rule, ...) and the KV
        policy settings (kv_policy, reserve_min_jobs, reserve_top_levels, admit_fraction).
        """
        sched_fields = {f.name for f in dataclasses.fields(SchedConfig)} - {"profile"}
        sched_kw = {k: v for k, v in changes.items() if k in sched_fields}
        cache_kw = {k: v for k, v in changes.items() if k in self.RETUNABLE_CACHE}
        unknown = sorted(set(changes) - set(sched_kw) - set(cache_kw))
        if unknown:
            raise ConfigError(
                f"cannot retune {', '.join(unknown)} while running; retunable: "
                f"{', '.join(sorted(sched_fields | set(self.RETUNABLE_CACHE)))}"
            )
        sched = dataclasses.replace(self.config.sched, **sched_kw)  # validates
        cache = dataclasses.replace(self.config.cache, **cache_kw)
        _engine_policy(sched.policy)
        now = time.time()
        # the scheduler refuses before changing anything; only then does the config change
        self.scheduler.retune(now, sched if sched_kw else None, cache if cache_kw else None)
        self.config = dataclasses.replace(self.config, sched=sched, cache=cache)
        self.events.add(now, "retune", None, **{k: _plain(v) for k, v in changes.items()})
        return self.config

    # ---- the iteration ---------------------------------------------------------

    def has_unfinished(self) -> bool:
        return bool(self._jobs) or bool(self._in_flight)

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

    def _busy(self) -> set[str]:
        """Jobs inside a micro-batch still in the pipeline."""
        return {j.job_id for mb in self._in_flight for j in mb.out.batch}

    def step(self) -> list[StepDelta]:
        """Run one iteration; return what each job in the collected batch produced.

        In process (and with pp = 1) this schedules a batch, runs it and returns its
        tokens. With pp micro-batches in flight it submits the next micro-batch when
        a slot is free, then collects the oldest: waiting for it only when the
        pipeline is full or there was nothing new to submit.

        Never raises (DESIGN: a serving engine loop never dies from one job). A job
        whose sampling or model step fails on its own ends with reason "error" and
        the rest of its batch goes on; an unexpected exception while submitting or
        collecting a micro-batch fails that micro-batch's jobs; one with no batch to
        blame (the scheduler's) fails every live job, so that it cannot repeat on
        every step. Each is logged once, with its traceback.
        """
        try:
            return self._step()
        except Exception as exc:  # noqa: BLE001 - last resort: the loop must go on
            try:
                return self._fail_all_after(describe("the engine step failed", exc), exc)
            except Exception:  # noqa: BLE001 - fail_all frees what it can, job by job
                log.exception("failing the live jobs failed too")
                return []

    def _step(self) -> list[StepDelta]:
        self._copies_done(self.swapper.poll())
        lost = self._copies_failed()
        if lost:
            return lost
        submitted = False
        if len(self._in_flight) < self.executor.max_in_flight:
            start = time.time()
            try:
                out = self.scheduler.schedule(start, busy=self._busy())
            except Exception as exc:  # noqa: BLE001 - no batch to blame: end every job
                return self._fail_all_after(describe("the scheduler failed", exc), exc)
            self.last_schedule = out
            async_ops = [op for op in out.swap_out + out.swap_in if not op.sync]
            try:
                self.events.schedule(out, start)
                if out.batch or out.sync_ops or async_ops:
                    prefills = [j for j in out.batch if j.is_prefill]
                    ticket = self.executor.submit(out.batch, out.sync_ops, async_ops)
                    self._in_flight.append(
                        _MicroBatch(
                            ticket,
                            out,
                            start,
                            len(prefills),
                            sum(j.num_new_tokens for j in prefills),
                        )
                    )
                    submitted = True
            except WorkerFailure as exc:
                return self._workers_failed(exc, extra=out)
            except Exception as exc:  # noqa: BLE001 - this micro-batch's jobs fail
                # submit raised before its copies started: none will be reported
                self._copies_done(async_ops)
                return self._micro_batch_failed(out, "submitting the step", exc, copies=True)
        deltas: list[StepDelta] = []
        if self._in_flight:
            full = len(self._in_flight) >= self.executor.max_in_flight
            deltas = self._collect(wait=full or not submitted)
        if not deltas and not self._in_flight and self.swapper.busy:
            # only copies to wait for: block on them, not spin
            self._copies_done(self.swapper.wait(timeout=0.05))
        return deltas

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
            if job.job_id in self._busy():  # its micro-batch frees its blocks on return
                deltas.append(self._error_finish(job, why, now))
            else:
                deltas.append(self._fail(job, why, now))
        return deltas

    def _collect(self, wait: bool) -> list[StepDelta]:
        """Finish the oldest micro-batch if it is done (or once it is, with `wait`)."""
        mb = self._in_flight[0]
        try:
            result = self.executor.result(mb.ticket, None if wait else 0.0)
        except WorkerFailure as exc:
            return self._workers_failed(exc)
        except Exception as exc:  # noqa: BLE001 - this micro-batch's jobs fail
            self._in_flight.popleft()
            if self.executor.copies_end_with_result:  # they ended, but unreported
                self._copies_done([op for op in mb.out.swap_out + mb.out.swap_in if not op.sync])
            return self._micro_batch_failed(mb.out, "collecting the step", exc)
        if result is None:
            return []
        self._in_flight.popleft()
        try:
            self._copies_done(result.swaps_done)
            if not mb.out.batch:
                return []
            return self._finish_step(mb, result)
        except Exception as exc:  # noqa: BLE001 - this micro-batch's jobs fail
            return self._micro_batch_failed(mb.out, "finishing the step", exc)

    def _finish_step(self, mb: _MicroBatch, result: StepResult) -> list[StepDelta]:
        out = mb.out
        now = time.time()
        deltas = []
        for job, tok in zip(out.batch, result.tokens, strict=True):
            if job.status.finished:  # aborted while its micro-batch was in flight
                continue
            if isinstance(tok, JobFault):
                deltas.append(self._job_fault(job, tok, now))
                continue
            try:
                deltas.append(self._append(job, tok, now))
            except Exception as exc:  # noqa: BLE001 - this job alone fails
                deltas.append(self._job_fault(job, JobFault.of("appending its token", exc), now))
        try:  # the batch's jobs have their deltas: keep them whatever happens now
            self.scheduler.update(out, now)
            self.events.demoted(out.demoted, now)
        except Exception as exc:  # noqa: BLE001 - the scheduler's state for them is lost
            return deltas + self._micro_batch_failed(out, "accounting the step", exc)
        self.iterations += 1
        n = len(out.batch)
        self.last_iteration = IterationStats(
            mb.start, now - mb.start, n, mb.prefill_tokens, n - mb.prefills
        )
        self.recent_iterations.append(self.last_iteration)
        return deltas

    # ---- failures of one job or one micro-batch ------------------------------------

    def _job_fault(self, job: Job, fault: JobFault, now: float) -> StepDelta:
        """One job's step failed on its own: end it; the batch's update() removes it."""
        log.error("job %s failed: %s%s", job.job_id, fault.message, _indent(fault.detail))
        return self._error_finish(job, fault.message, now)

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
        busy = self._busy()
        for job in unique:
            if not job.status.finished:
                deltas.append(self._fail(job, message, now))
            elif job.job_id not in busy and self.scheduler.get(job.job_id) is job:
                self.scheduler.remove(job)  # finished or aborted: only the scheduler holds it
        return deltas

    def fail_all(self, reason: str) -> list[StepDelta]:
        """End every live job with reason "error" and `reason`; return their last deltas.

        The last resort when no single job or batch is to blame (the scheduler
        raised; the daemon gives up); the caller logs why. A job inside a micro-batch
        still in flight ends now and its blocks return when the micro-batch comes back.
        """
        now = time.time()
        busy = self._busy()
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
        live = list(self._jobs)
        log.error("%s; failing every live job: %s", reason, _ids(live), exc_info=exc)
        return self.fail_all(reason)

    # ---- worker failure ----------------------------------------------------------

    def _workers_failed(
        self, exc: WorkerFailure, extra: SchedulerOutput | None = None
    ) -> list[StepDelta]:
        """A worker died: fail the jobs whose KV or step was lost, restart the workers.

        Lost: every micro-batch in flight and every job's KV (device and host tiers
        live in the workers). Jobs that hold no KV yet keep their place and run on
        the fresh workers. If the restart fails the engine refuses new jobs and
        fails the rest; `degraded` says why either way.
        """
        now = time.time()
        self.worker_failures += 1
        lost = [mb.out for mb in self._in_flight] + ([extra] if extra is not None else [])
        self._in_flight.clear()
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
            self.degraded = (
                f"{reason} ({len(doomed)} jobs failed); restarting the workers failed: "
                f"{restart_exc}; new requests are refused"
            )
            log.error("%s", self.degraded)
            deltas += [self._fail(job, reason, now) for job in self.scheduler.jobs()]
            return deltas
        self.degraded = (
            f"{reason} at {time.strftime('%H:%M:%S', time.localtime(now))} "
            f"({len(doomed)} jobs failed); workers restarted "
            f"({self.worker_failures} time{'s' if self.worker_failures > 1 else ''}), serving"
        )
        log.warning("%s", self.degraded)
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

    def close(self) -> None:
        """Stop the workers and copy threads (the engine cannot run afterwards)."""
        self._in_flight.clear()
        self.executor.close()

    def _append(self, job: Job, token: int, now: float) -> StepDelta:
        job.num_computed_tokens = job.num_tokens
        job.output_token_ids.append(token)
        job.token_times.append(now)
        if job.first_token_time is None:
            job.first_token_time = now
        text = self._text[job.job_id]
        delta = text.add(token)
        reason, stop = self._stop_check(job, token, text.stop)
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

    def _stop_check(
        self, job: Job, token: int, stop_string: str | None
    ) -> tuple[FinishReason | None, str | int | None]:
        p = job.params
        n = len(job.output_token_ids)
        if stop_string is not None:
            return FinishReason.STOP, stop_string
        if n >= p.min_tokens:
            if not p.ignore_eos and token in self.eos_ids:
                return FinishReason.STOP, token
            if token in p.stop_token_ids:
                return FinishReason.STOP, token
        if n >= job.max_output or job.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def _release(self, job: Job) -> RequestOutput:
        self._jobs.pop(job.job_id, None)
        text = self._text.pop(job.job_id, None)  # None: released already, mid-failure
        self.sampler.forget(job.job_id)
        return RequestOutput.of(job, text.text if text is not None else "")

    def output(self, job: Job) -> RequestOutput:
        """The result so far of a job (finished or not)."""
        text = self._text.get(job.job_id)
        return RequestOutput.of(job, text.text if text else "")


def _engine_policy(name: str) -> str:
    """A policy the engine can run: any but the simulator's output-length oracle."""
    resolved = resolve_policy(name)
    if resolved == "srpt":
        raise ConfigError("policy 'srpt' needs true output lengths; it runs in the simulator only")
    return resolved


def _ids(jobs: Iterable[Job | str], limit: int = 20) -> str:
    """Job ids for a log line, the first `limit` of them."""
    ids = [j if isinstance(j, str) else j.job_id for j in jobs]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return (", ".join(ids[:limit]) or "(none)") + more


def _indent(detail: str) -> str:
    """A traceback as a continuation of a log line ("" when there is none)."""
    return "\n" + detail.rstrip() if detail else ""


def _plain(value: Any) -> Any:
    """A retune value as telemetry can carry it (tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value
