"""One step function: `Worker.step` over a `StepPlan`, whole or split into pipeline stages.

The local executor runs the whole model on one in-process worker; Ray runs one
worker per stage. Here both layouts run in this process (no Ray): two stages handing
activations on must sample exactly the tokens of the whole model, greedy and seeded.
"""

from __future__ import annotations

import pytest

from fsd.config import CacheConfig, ModelConfig
from fsd.engine.plan import build_plan, unorder
from fsd.engine.stage import stage_spans
from fsd.engine.worker import Worker, WorkerSpec
from fsd.jobs import Job, SamplingParams

BLOCK = 4
PROMPTS = [[5, 17, 99, 42, 7], [8] * 11, [120, 3]]
PARAMS = [
    SamplingParams(max_tokens=8, ignore_eos=True),
    SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.9, seed=11),
    SamplingParams(max_tokens=8, ignore_eos=True),
]


def make_worker(model: str, span=None) -> Worker:  # noqa: ANN001
    cache = CacheConfig(block_size=BLOCK, num_gpu_blocks=32, num_host_blocks=0)
    worker = Worker(WorkerSpec(ModelConfig(model=model, device="cpu"), cache, span=span))
    worker.setup()
    worker.allocate(32, 0)
    return worker


def generate(stages: list[Worker], steps: int) -> list[list[int]]:
    """Prefill the prompts, then decode `steps - 1` tokens, through every stage in turn."""
    jobs = [
        Job(prompt_token_ids=list(p), params=sp, job_id=f"j{i}")
        for i, (p, sp) in enumerate(zip(PROMPTS, PARAMS, strict=True))
    ]
    for k, job in enumerate(jobs):  # disjoint blocks, enough for the whole run
        job.block_table = list(range(k * 8, k * 8 + 8))
    for _ in range(steps):
        for job in jobs:
            job.step_tokens = job.num_new_tokens  # whole prefills, then decodes
        plan = build_plan(1, jobs)
        hidden = None
        for worker in stages:
            hidden = worker.step(plan, hidden)
        for job, token in zip(jobs, unorder(plan, hidden), strict=True):
            assert isinstance(token, int)
            job.num_computed_tokens = job.num_tokens
            job.output_token_ids.append(token)
    return [job.output_token_ids for job in jobs]


@pytest.mark.parametrize("model", ["tiny-opt", "tiny"])
def test_two_stages_in_turn_sample_the_tokens_of_the_whole_model(model):
    whole = generate([make_worker(model)], steps=6)
    spans = stage_spans(make_worker(model).info.arch.num_layers, 2)
    first, last = (make_worker(model, span) for span in spans)
    assert first.sampler is None and last.sampler is not None  # one place draws
    assert generate([first, last], steps=6) == whole
