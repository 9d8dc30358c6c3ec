"""Replicas as Ray actors on CPU: each job runs in one actor process and gives the
tokens one engine gives; the verbs cross the process boundary with their errors."""

from __future__ import annotations

import time

import pytest

from fsd.admission import JobRequest
from fsd.cluster.start import start_replicas
from fsd.config import EngineConfig
from fsd.engine.core import Engine
from fsd.engine.face import EngineFace
from fsd.errors import UnknownJobError
from fsd.jobs import SamplingParams
from tests.cluster.test_replica_set import CONFIG, PARAMS, PROMPTS, run


def test_ray_replicas_serve_like_one_engine(ray_cluster):
    single = EngineFace(Engine(EngineConfig.from_kwargs(**CONFIG)))
    want = run(single, [single.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS])
    single.close()
    face = start_replicas(EngineConfig.from_kwargs(**CONFIG), 2)
    try:
        ids = [face.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS]
        assert {face.replica_of(i) for i in ids} == {0, 1}
        got = run(face, ids, limit=120.0)
        assert [got[i][0] for i in ids] == [tokens for tokens, _ in want.values()]
        job = face.admit(JobRequest([5, 6], SamplingParams(max_tokens=500, ignore_eos=True))).job_id
        assert face.abort(job).finish_reason == "abort"
        with pytest.raises(UnknownJobError):
            face.abort(job)
        assert face.snapshot().kv.device_total == 128
        # an actor that dies: its jobs that had not started run on the other one
        ids = [face.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS]
        face.replicas.kill(1)
        got = run(face, ids, limit=120.0)
        assert [got[i][0] for i in ids] == [tokens for tokens, _ in want.values()]
        assert 1 in face.replicas.down and "killed by `ray.kill`" in face.replicas.down[1]
        deadline = time.monotonic() + 120
        while 1 in face.replicas.down:  # Ray starts a fresh actor in its place
            assert time.monotonic() < deadline, "the replica never came back"
            face.step()
        assert face.admit(JobRequest(PROMPTS[0], PARAMS)) and len(face.snapshot().replicas) == 2
    finally:
        face.close()


def test_llm_with_replicas_generates_what_one_engine_does(ray_cluster):
    from fsd import LLM

    prompts = ["The quick brown fox", "Hello", "A longer prompt of several words", "x"]
    with LLM(**CONFIG) as one:
        want = [o.token_ids for o in one.generate(prompts, PARAMS)]
    with LLM(**CONFIG, replicas=2) as many:
        assert many.engine is None
        got = many.generate(prompts, PARAMS)
        assert [o.token_ids for o in got] == want
        streamed = list(many.stream("Hello", PARAMS))
        assert streamed[-1].output is not None and streamed[-1].output.token_ids == want[1]


def test_ray_replicas_move_jobs_between_actors(ray_cluster):
    from tests.cluster.test_replica_set import run_single

    face = start_replicas(EngineConfig.from_kwargs(**CONFIG, max_batch_size=1), 2)
    try:
        ids = [face.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS]
        detail = face.drain_replica(1)  # its waiting jobs cross to the other actor
        assert detail["moved"] >= 1
        got = run(face, ids, limit=120.0)
        assert [got[j][0] for j in ids] == run_single(PROMPTS)
    finally:
        face.close()


def test_tp2_replicas_each_reserve_their_workers_in_a_group_of_their_own(ray_cluster):
    from ray.util import placement_group_table

    from fsd.cluster.groups import ReplicaShape, check_fits
    from fsd.errors import ConfigError
    from tests.cluster.test_replica_set import run_single

    config = EngineConfig.from_kwargs(**CONFIG, tp=2)
    # 3 replicas of 2 CPU each cannot fit 4: refused at once, nothing placed
    with pytest.raises(ConfigError, match=r"3 replicas of tp x pp = 2 need 6 CPU in all"):
        start_replicas(config, 3)
    with pytest.raises(ConfigError, match=r"need 2 GPU in all .* the Ray cluster has 1"):
        check_fits(ReplicaShape(world=1, on_gpu=True, cpus=1.0), 2, {"CPU": 16, "GPU": 1})
    face = start_replicas(config, 2)
    try:
        groups = face.replicas.groups.groups
        assert len(groups) == 2
        for group in groups:
            table = placement_group_table(group)
            assert table["state"] == "CREATED" and table["strategy"] == "STRICT_PACK"
            assert [b["CPU"] for b in table["bundles"].values()] == [1.0, 0.5, 0.5]
        # every reserved CPU is taken by the replicas' actors and their tp workers
        assert ray_cluster.available_resources().get("CPU", 0.0) == 0.0
        ids = [face.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS]
        assert {face.replica_of(i) for i in ids} == {0, 1}
        got = run(face, ids, limit=240.0)
        assert [got[j][0] for j in ids] == run_single(PROMPTS)
    finally:
        face.close()
    deadline = time.monotonic() + 30  # the groups are removed, their CPUs free again
    while ray_cluster.available_resources().get("CPU", 0.0) < 4.0:
        assert time.monotonic() < deadline, ray_cluster.available_resources()
        time.sleep(0.2)
