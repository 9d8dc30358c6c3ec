"""A worker killed mid-run: its jobs end with an error, the engine restarts its
workers and serves again, and a real daemon stays up and says it is degraded until
the fresh workers have served."""

from __future__ import annotations

import pytest

from fsd import LLM, SamplingParams
from fsd.engine.executor import WorkerFailure
from fsd.errors import ConfigError
from fsd.jobs import KVLocation
from tests.server.daemon_proc import start_daemon

PROMPTS = [[5, 17, 99, 42], [8] * 11, [120, 3, 64, 77, 200, 31, 9]]
PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


def test_a_killed_worker_fails_its_jobs_then_fresh_workers_serve(
    cpu_llm, ray_cluster, profile_path
):
    with LLM("tiny-opt", num_gpu_blocks=64, profile=profile_path) as ref:
        want = ref.generate(PROMPTS[2], PARAMS)[0].token_ids
    with cpu_llm("tiny-opt", tp=2, max_batch_size=2, num_gpu_blocks=64, num_host_blocks=16) as llm:
        eng = llm.engine
        running = [eng.add_request(p, PARAMS) for p in PROMPTS[:2]]
        waiting = eng.add_request(PROMPTS[2], PARAMS)  # fcfs, batch of 2: not started
        for _ in range(3):
            eng.step()
        assert all(len(j.output_token_ids) == 3 for j in running)
        assert waiting.kv is KVLocation.NONE and waiting.num_computed_tokens == 0
        ray_cluster.kill(eng.executor.worker_handles()[0][1])

        finals, reported = {}, None
        while eng.has_unfinished():
            for d in eng.step():
                if d.output is not None:
                    finals[d.job_id] = d.output
            reported = reported or eng.degraded
        assert [finals[j.job_id].finish_reason for j in running] == ["error", "error"]
        assert all("worker failure" in finals[j.job_id].error for j in running)
        assert finals[waiting.job_id].finish_reason == "length"
        assert finals[waiting.job_id].token_ids == want  # ran on the restarted workers
        assert "worker stage 0 tp rank 1 died" in reported
        assert "2 jobs failed" in reported and "restarted" in reported
        assert eng.degraded is None  # the restarted workers served: healthy again
        assert llm.generate(PROMPTS[2], PARAMS)[0].token_ids == want
        eng.blocks.check()
        assert eng.blocks.device.num_free == 64 and eng.blocks.host.num_free == 16

        # a second failure whose restart fails: every job ends, new work is refused
        def no_restart() -> None:
            raise WorkerFailure("no resources for new workers")

        eng.executor.restart = no_restart
        jobs = [eng.add_request(p, PARAMS) for p in PROMPTS]
        eng.step()
        ray_cluster.kill(eng.executor.worker_handles()[0][0])
        ended = [d.output for _ in range(3) for d in eng.step() if d.output is not None]
        assert sorted(o.request_id for o in ended) == sorted(j.job_id for j in jobs)
        assert {o.finish_reason for o in ended} == {"error"}
        assert "no resources for new workers" in eng.degraded and "refused" in eng.degraded
        with pytest.raises(WorkerFailure, match="not serving"):
            eng.add_request(PROMPTS[0], PARAMS)
        assert not eng.has_unfinished()


def test_tp_or_pp_that_does_not_fit_the_model_is_refused_before_ray_starts():
    with pytest.raises(ConfigError, match="tp=3 must divide the model's num_heads"):
        LLM("tiny-opt", tp=3)
    with pytest.raises(
        ConfigError, match=r"pp=3 must be between 1 and the model's num_layers \(2\)"
    ):
        LLM("tiny-opt", pp=3)
    with pytest.raises(ConfigError, match="tp must be an integer >= 1"):
        LLM("tiny-opt", tp=0)


def test_the_daemon_survives_a_killed_worker_and_reports_it(ray_cluster, profile_path, tmp_path):
    address = ray_cluster.get_runtime_context().gcs_address
    config = f"""
[model]
model = "tiny-opt"
device = "cpu"
[cache]
num_gpu_blocks = 64
num_host_blocks = 16
[sched]
policy = "fcfs"
profile = "{profile_path}"
[parallel]
tp = 2
ray_address = "{address}"
[server]
telemetry_hz = 0.0
"""
    daemon = start_daemon(tmp_path, config)
    try:
        with daemon.client(timeout=30.0) as client:
            long = client.submit(PROMPTS[0], max_tokens=400, ignore_eos=True)
            first = next(iter(long))  # it is running
            assert first.token_ids
            prefix, suffix = f"fsd-{daemon.proc.pid}-", "-g0-s0-r1"  # fsd-PID-UID-g0-s0-r1
            names = [
                a["name"]
                for a in ray_cluster.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == "fsd"
                and a["name"].startswith(prefix)
                and a["name"].endswith(suffix)
            ]
            assert len(names) == 1, names
            victim = ray_cluster.get_actor(names[0], namespace="fsd")
            ray_cluster.kill(victim)
            lost = long.result(timeout=60)
            assert lost.finish_reason == "error"  # and its Finished says why
            assert lost.message and "worker stage 0 tp rank 1 died" in lost.message
            status = client.status()
            assert status.degraded and "worker stage 0 tp rank 1 died" in status.degraded
            after = client.complete(PROMPTS[2], max_tokens=8, ignore_eos=True)
            assert after.finish_reason == "length" and len(after.token_ids) == 8
            assert client.status().degraded is None  # fresh workers served: healthy
            assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0
