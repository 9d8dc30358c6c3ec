"""After a Ray worker dies the engine is healthy again once fresh workers serve:
`degraded` clears, and a worker that died while the engine was idle costs no
request (the next one finds it dead before its micro-batch, not inside it)."""

from __future__ import annotations

import time

from fsd import LLM, SamplingParams
from fsd.engine import ray_executor

PROMPT = [120, 3, 64, 77, 200, 31, 9]
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


def kill_and_wait(ray, actor) -> None:
    """Kill `actor` and return once Ray reports it dead (a call to it fails)."""
    ray.kill(actor)
    while True:
        try:
            ray.get(actor.ping.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)


def test_degraded_clears_once_fresh_workers_serve(cpu_llm, ray_cluster, profile_path):
    with LLM("tiny-opt", num_gpu_blocks=64, profile=profile_path) as ref:
        want = ref.generate(PROMPT, PARAMS)[0].token_ids
    with cpu_llm("tiny-opt", tp=2, num_gpu_blocks=64, num_host_blocks=16) as llm:
        eng = llm.engine
        job = eng.add_request(PROMPT, PARAMS)
        eng.step()
        ray_cluster.kill(eng.executor.worker_handles()[0][1])
        while eng.has_unfinished():
            eng.step()
        assert eng.degraded and "worker stage 0 tp rank 1 died" in eng.degraded
        assert eng.worker_failures == 1 and not eng._refusing
        out = llm.generate(PROMPT, PARAMS)[0]  # fresh workers serve it
        assert out.finish_reason == "length" and out.token_ids == want
        assert eng.degraded is None  # healthy again
        assert job.status.finished and job.error and "worker failure" in job.error


def test_a_worker_dead_while_idle_costs_no_request(cpu_llm, ray_cluster, profile_path):
    with LLM("tiny-opt", num_gpu_blocks=64, profile=profile_path) as ref:
        want = ref.generate(PROMPT, PARAMS)[0].token_ids
    with cpu_llm("tiny-opt", tp=2, num_gpu_blocks=64, num_host_blocks=16) as llm:
        eng = llm.engine
        assert llm.generate(PROMPT, PARAMS)[0].token_ids == want
        kill_and_wait(ray_cluster, eng.executor.worker_handles()[0][0])
        time.sleep(getattr(ray_executor, "IDLE_CHECK", 1.0))  # idle long enough for the check before a batch
        out = llm.generate(PROMPT, PARAMS)[0]
        assert out.finish_reason == "length", out.error  # it failed before the fix
        assert out.token_ids == want  # served by the restarted workers
        assert eng.worker_failures == 1 and eng.executor.restarts == 1
        assert eng.degraded is None
