"""A preempted job moves to another engine and goes on with the tokens it would have
made there: its KV from the host tier, its seeded sampler where it stopped."""

from __future__ import annotations

import pytest

from fsd.config import EngineConfig
from fsd.engine.core import Engine
from fsd.engine.migration import CannotMove, bring_in, take_out
from fsd.errors import UnknownJobError
from fsd.jobs import JobStatus, KVLocation, SamplingParams

# a device pool of 12 blocks, one job per batch and a tiny quantum: jobs take turns,
# and a preempted one goes to host memory within a few steps
CONFIG = dict(
    model="tiny", device="cpu", num_gpu_blocks=12, num_host_blocks=64, policy="sj-mlfq",
    max_batch_size=1, profile="opt-13b-a100", threads=1, q1=0.001,
)  # fmt: skip


def params(i: int) -> SamplingParams:
    return SamplingParams(max_tokens=60, temperature=0.8, seed=7 + i, ignore_eos=True)


def outputs(engine: Engine, only: set[str] | None = None) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for d in engine.step():
            if d.output is not None and (only is None or d.job_id in only):
                done[d.job_id] = d.output.token_ids
    return done


def start(engine: Engine) -> list[str]:
    return [engine.add_request([5 + i] * 40, params(i)).job_id for i in range(4)]


@pytest.fixture(scope="module")
def want() -> dict[str, list[int]]:
    engine = Engine(EngineConfig.from_kwargs(**CONFIG))
    ids = start(engine)
    out = outputs(engine)
    engine.close()
    return {str(i): out[j] for i, j in enumerate(ids)}


def test_a_job_preempted_to_host_memory_moves_with_its_kv_and_its_tokens_are_the_same(want):
    here = Engine(EngineConfig.from_kwargs(**CONFIG))
    there = Engine(EngineConfig.from_kwargs(**CONFIG))
    ids = start(here)
    while True:  # until a started job waits on the host tier
        here.step()
        hosted = [
            j for j in here.scheduler.jobs()
            if j.kv is KVLocation.HOST and j.status is JobStatus.PREEMPTED and j.output_token_ids
        ]  # fmt: skip
        if hosted:
            break
    job = hosted[0]
    so_far, blocks = list(job.output_token_ids), len(job.host_block_table)
    moved = take_out(here, job.job_id)
    assert moved.kv is not None and moved.kv.shape[0] == blocks and moved.seed_state is not None
    assert here.scheduler.get(job.job_id) is None
    arrived = bring_in(there, moved)
    assert arrived.kv is KVLocation.HOST and arrived.output_token_ids == so_far
    got = {**outputs(here), **outputs(there)}
    assert {i: got[j] for i, j in zip(want, ids, strict=True)} == want
    there.blocks.check()
    here.blocks.check()
    here.close()
    there.close()


def test_a_job_that_never_ran_moves_without_kv_and_a_running_one_stays():
    here = Engine(EngineConfig.from_kwargs(**CONFIG))
    there = Engine(EngineConfig.from_kwargs(**CONFIG))
    ids = start(here)
    here.step()
    running = next(j for j in here.scheduler.jobs() if j.status is JobStatus.RUNNING)
    with pytest.raises(CannotMove, match="it is running"):
        take_out(here, running.job_id)
    waiting = next(j for j in here.scheduler.jobs() if not j.output_token_ids)
    moved = take_out(here, waiting.job_id)
    assert moved.kv is None and moved.job.num_computed_tokens == 0
    bring_in(there, moved)
    got = outputs(there)
    assert list(got) == [waiting.job_id] and len(got[waiting.job_id]) == 60
    with pytest.raises(UnknownJobError):
        take_out(here, waiting.job_id)
    assert set(outputs(here)) == set(ids) - {waiting.job_id}
    here.close()
    there.close()
