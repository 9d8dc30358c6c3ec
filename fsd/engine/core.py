"""The engine: admits jobs, runs iterations, streams tokens, finishes jobs.

One `step()` is one iteration of the heartbeat in DESIGN.md §1: schedule, run the
model on the batch, append and stream the sampled tokens, then let the policy
account the iteration. Everything about *which* jobs run lives in the scheduler.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fsd.config import EngineConfig, SchedConfig
from fsd.engine.events import EventLog
from fsd.engine.kv_cache import KVCachePool, KVShape, num_device_blocks, num_host_blocks
from fsd.engine.model_runner import ModelRunner
from fsd.engine.output import RequestOutput, StepDelta
from fsd.engine.sampler import Sampler
from fsd.engine.swapper import HostKVPool, Swapper
from fsd.engine.text import JobText
from fsd.errors import ConfigError, PromptTooLongError, UnknownJobError
from fsd.jobs import FinishReason, Job, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.kv.swap import SwapOp
from fsd.models.loader import load_model
from fsd.sched.profile import CostModel
from fsd.sched.registry import make_scheduler, resolve_policy
from fsd.sched.scheduler import SchedulerOutput


@dataclass(frozen=True)
class IterationStats:
    """What one iteration did (kept for benches and telemetry)."""

    start: float
    duration: float
    batch_size: int
    prefill_tokens: int
    decode_tokens: int


class Engine:
    """A model, its paged KV pool, a scheduling policy and the jobs in flight."""

    def __init__(self, config: EngineConfig, cost: CostModel | None = None) -> None:
        """`cost`: a ready cost model; otherwise config.sched.profile or a quick calibration."""
        _engine_policy(config.sched.policy)  # fail on a bad policy before loading weights
        self.config = config
        self.loaded = load_model(config.model)
        self.tokenizer = self.loaded.tokenizer
        self.eos_ids = frozenset(self.tokenizer.eos_token_ids)
        self.device = self.loaded.device
        self.max_model_len = self.loaded.max_model_len
        arch = self.loaded.arch
        shape = KVShape(arch.num_layers, arch.num_kv_heads, arch.head_dim, self.loaded.dtype)
        block_size = config.cache.block_size
        num_blocks = num_device_blocks(config.cache, shape, self.device)
        host_blocks = num_host_blocks(config.cache, shape)
        self.pool = KVCachePool(shape, num_blocks, block_size, self.device)
        self.host_pool = HostKVPool(shape, host_blocks, block_size, pin=self.device.type == "cuda")
        self.swapper = Swapper(self.pool, self.host_pool)
        self.blocks = BlockManager(num_blocks, block_size, host_blocks)
        self.sampler = Sampler(config.model.seed, self.device)
        self.runner = ModelRunner(
            self.loaded.model, self.pool, self.sampler, self.device, self.eos_ids
        )
        self.cost = cost or self._cost_model()
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
        params = params or SamplingParams()
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

        return calibrate(self, self.config.sched.profile)

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
        self.scheduler.remove(job)
        job.finish(FinishReason.ABORT, time.time())
        self.events.add(job.finish_time or 0.0, "abort", job, tokens=len(job.output_token_ids))
        return self._release(job)

    # ---- live settings ---------------------------------------------------------

    RETUNABLE_CACHE = ("kv_policy", "reserve_min_jobs", "reserve_top_levels")

    def retune(self, **changes: Any) -> EngineConfig:
        """Change scheduling settings between iterations without losing a job.

        Accepts SchedConfig fields (policy, quanta, q1, quantum_ratio, num_levels,
        starve_limit, starve_promote, max_batch_size, max_batch_tokens) and the KV
        policy settings (kv_policy, reserve_min_jobs, reserve_top_levels).
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
        self.config = dataclasses.replace(self.config, sched=sched, cache=cache)
        now = time.time()
        self.scheduler.retune(now, sched if sched_kw else None, cache if cache_kw else None)
        self.events.add(now, "retune", None, **{k: _plain(v) for k, v in changes.items()})
        return self.config

    # ---- the iteration ---------------------------------------------------------

    def has_unfinished(self) -> bool:
        return bool(self._jobs)

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
        """Run one iteration; return what each job in the batch produced."""
        self._copies_done(self.swapper.poll())
        start = time.time()
        out = self.scheduler.schedule(start)
        self.last_schedule = out
        self.events.schedule(out, start)
        self.swapper.run_sync(out.sync_ops)
        self.swapper.start([op for op in out.swap_out + out.swap_in if not op.sync])
        if not out.batch:
            if self.swapper.busy:  # only copies to wait for: block on them, not spin
                self._copies_done(self.swapper.wait(timeout=0.05))
            return []
        prefills = [j for j in out.batch if j.is_prefill]
        prefill_tokens = sum(j.num_new_tokens for j in prefills)
        tokens = self.runner.execute(out.batch)
        now = time.time()
        deltas = [self._append(job, tok, now) for job, tok in zip(out.batch, tokens, strict=True)]
        self.scheduler.update(out, now)
        self.events.demoted(out.demoted, now)
        self.iterations += 1
        self.last_iteration = IterationStats(
            start, now - start, len(out.batch), prefill_tokens, len(out.batch) - len(prefills)
        )
        self.recent_iterations.append(self.last_iteration)
        return deltas

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
        text = self._text.pop(job.job_id)
        self.sampler.forget(job.job_id)
        return RequestOutput.of(job, text.text)

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


def _plain(value: Any) -> Any:
    """A retune value as telemetry can carry it (tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value
