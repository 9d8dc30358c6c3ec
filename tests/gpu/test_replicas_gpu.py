"""Replicas on a GPU: a preempted job's KV crosses between two CUDA engines through
host memory with the same tokens, and a Ray replica reserves its GPU in a placement
group of its own and serves a single engine's tokens; what does not fit is refused.

One job per batch, so every step has the same shapes wherever the job runs (the
same kernels: bit-identical logits, not only close ones).
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from fsd.admission import JobRequest
from fsd.config import EngineConfig
from fsd.engine.core import Engine
from fsd.engine.migration import bring_in, take_out
from fsd.errors import ConfigError
from fsd.jobs import JobStatus, KVLocation, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CONFIG = dict(
    model="tiny", device="cuda", num_gpu_blocks=12, num_host_blocks=64, policy="sj-mlfq",
    max_batch_size=1, profile="opt-13b-a100", q1=0.001,
)  # fmt: skip


def params(i: int) -> SamplingParams:
    return SamplingParams(max_tokens=40, temperature=0.8, seed=7 + i, ignore_eos=True)


def drain(engine: Engine) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for d in engine.step():
            if d.output is not None:
                done[d.job_id] = d.output.token_ids
    return done


def start(engine: Engine) -> list[str]:
    return [engine.add_request([5 + i] * 40, params(i)).job_id for i in range(4)]


def test_a_job_preempted_to_host_moves_between_cuda_engines_with_the_same_tokens():
    ref = Engine(EngineConfig.from_kwargs(**CONFIG))
    ref_ids = start(ref)
    want = drain(ref)
    ref.close()
    here = Engine(EngineConfig.from_kwargs(**CONFIG))
    there = Engine(EngineConfig.from_kwargs(**CONFIG))
    ids = start(here)
    hosted: list = []
    while not hosted:  # until a started job waits on the host tier
        here.step()
        hosted = [
            j for j in here.scheduler.jobs()
            if j.kv is KVLocation.HOST and j.status is JobStatus.PREEMPTED and j.output_token_ids
        ]  # fmt: skip
    moved = take_out(here, hosted[0].job_id)
    assert moved.kv is not None and moved.kv.device.type == "cpu"  # it crossed via the host
    bring_in(there, moved)
    got = {**drain(here), **drain(there)}
    assert [got[j] for j in ids] == [want[j] for j in ref_ids]
    here.close()
    there.close()


@pytest.mark.timeout(240)
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray")
def test_a_ray_replica_reserves_its_gpu_and_serves_a_single_engines_tokens():
    from ray.util import placement_group_table

    from fsd.cluster.start import start_replicas

    prompts = [[5 + i, 6, 7, 8 + i] * 5 for i in range(3)]
    config = EngineConfig.from_kwargs(**CONFIG)
    ref = Engine(config)
    want = []
    for i, p in enumerate(prompts):  # one at a time: the replica runs them the same way
        job = ref.add_request(p, params(i)).job_id
        want.append(drain(ref)[job])
    ref.close()
    gpus = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=rf"need {gpus + 1:g} GPU in all"):
        start_replicas(config, gpus + 1)
    face = start_replicas(config, 1)
    try:
        (group,) = face.replicas.groups.groups
        table = placement_group_table(group)
        assert table["state"] == "CREATED" and list(table["bundles"].values()) == [
            {"CPU": 1.0, "GPU": 1.0}
        ]
        got = []
        for i, p in enumerate(prompts):
            job = face.admit(JobRequest(p, params(i))).job_id
            tokens: list[int] = []
            deadline = time.monotonic() + 120
            while True:
                assert time.monotonic() < deadline
                deltas = [d for d in face.step().deltas if d.job_id == job]
                tokens += [t for d in deltas for t in d.new_token_ids]
                if any(d.finished for d in deltas):
                    break
            got.append(tokens)
        assert got == want
    finally:
        face.close()
    tp = EngineConfig.from_kwargs(**CONFIG, tp=gpus + 1)
    with pytest.raises(ConfigError, match="GPU"):
        start_replicas(tp, 1)
