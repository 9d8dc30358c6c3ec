"""Offline API: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from fsd.config import EngineConfig
from fsd.engine.core import Engine
from fsd.engine.output import RequestOutput, StepDelta
from fsd.jobs import SamplingParams

log = logging.getLogger("fsd.llm")

Prompt = str | Sequence[int]

# An iteration with nothing to run while jobs wait is legitimate only briefly (KV
# copies in flight); this many in a row means the policy is stuck.
_MAX_IDLE_STEPS = 10_000


class LLM:
    """Runs the engine in this process until every prompt is done.

    `model` is a preset name ("tiny", "opt-125m", ...) or a local HuggingFace
    directory; other keywords are engine options named after config fields
    (num_gpu_blocks, block_size, max_batch_size, dtype, device, seed, policy, ...).
    `tp=N, pp=M` shard the model over N x M Ray workers (`ray_address=` joins a
    cluster; otherwise a local Ray starts); close() (or `with LLM(...)`) stops them.
    """

    def __init__(self, model: str = "tiny", **engine_options: Any) -> None:
        self.engine = Engine(EngineConfig.from_kwargs(model=model, **engine_options))

    def close(self) -> None:
        """Stop the engine's workers (Ray actors, copy threads)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tokenizer(self):  # noqa: ANN201
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for each prompt; outputs come back in the prompts' order.

        A job that failed comes back finished, with finish_reason "error" and the
        reason in `error`; the other prompts are unaffected. A max_tokens past the
        model's context is cut to it here (the daemon refuses one, naming the limit).
        """
        batch = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(batch))
        jobs = []
        try:
            for p, sp in zip(batch, params, strict=True):
                jobs.append(self.engine.add_request(p, sp))
        except BaseException:
            for job in jobs:  # a refused prompt refuses the call: run none of it
                self.engine.abort(job.job_id)
            raise
        results: dict[str, RequestOutput] = {}
        for delta in self._run():
            if delta.output is not None:
                results[delta.job_id] = delta.output
        return [results[j.job_id] for j in jobs]

    def stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> Iterator[StepDelta]:
        """Yield one delta per iteration for a single prompt, the last one with the output."""
        job = self.engine.add_request(prompt, sampling_params)
        for delta in self._run():
            if delta.job_id == job.job_id:
                yield delta

    def _run(self) -> Iterator[StepDelta]:
        idle = 0
        gave_up = False
        while self.engine.has_unfinished():
            deltas = self.engine.step()  # never raises: a failed job ends with "error"
            idle = 0 if deltas else idle + 1
            if idle > _MAX_IDLE_STEPS:
                if gave_up:  # nothing left to fail, yet the engine is not idle
                    raise RuntimeError("the engine made no progress after failing every job")
                reason = "the scheduler made no progress; the jobs were stuck"
                log.error("%s", reason)
                deltas, idle, gave_up = self.engine.fail_all(reason), 0, True
            yield from deltas


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [items]  # one prompt given as token ids
    return items


def _as_params_list(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    items = list(params)
    if len(items) != n:
        raise ValueError(f"got {len(items)} sampling params for {n} prompts")
    return items
