"""Offline API: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from fsd.admission import JobRequest
from fsd.config import ClusterConfig, EngineConfig
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
    cluster; otherwise a local Ray starts); `replicas=N` runs N engines as Ray actors,
    each prompt on one of them, placed by `router` (fsd.router; `engine` is then
    None); close() (or `with LLM(...)`) stops them.
    """

    def __init__(
        self, model: str = "tiny", *, replicas: int = 1, router: str = "default", **engine_options: Any
    ) -> None:
        config = EngineConfig.from_kwargs(model=model, **engine_options)
        self.engine: Engine | None = None
        self.replicas: Any = None  # fsd.cluster.face.ReplicaSetFace, with replicas > 1
        if replicas == 1:
            self.engine = Engine(config)
        else:
            from fsd.cluster.start import start_replicas

            cluster = ClusterConfig(replicas=replicas, router=router)
            self.replicas = start_replicas(config, replicas, cluster=cluster)

    def close(self) -> None:
        """Stop the engine's workers (Ray actors, copy threads)."""
        (self.engine or self.replicas).close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tokenizer(self):  # noqa: ANN201
        return (self.engine or self.replicas).tokenizer

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
        jobs: list[str] = []
        try:
            for p, sp in zip(batch, params, strict=True):
                jobs.append(self._add(p, sp))
        except BaseException:
            for job_id in jobs:  # a refused prompt refuses the call: run none of it
                (self.engine or self.replicas).abort(job_id)
            raise
        results: dict[str, RequestOutput] = {}
        for delta in self._run():
            if delta.output is not None:
                results[delta.job_id] = delta.output
        return [results[j] for j in jobs]

    def stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> Iterator[StepDelta]:
        """Yield one delta per iteration for a single prompt, the last one with the output."""
        job_id = self._add(prompt, sampling_params)
        for delta in self._run():
            if delta.job_id == job_id:
                yield delta

    def _add(self, prompt: Prompt, params: SamplingParams | None) -> str:
        if self.engine is not None:
            return self.engine.add_request(prompt, params).job_id
        return self.replicas.admit(JobRequest(prompt, params or SamplingParams())).job_id

    def _run(self) -> Iterator[StepDelta]:
        if self.engine is None:  # each replica runs its own loop; gather what they made
            while self.replicas.busy():
                yield from self.replicas.step().deltas
            return
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
