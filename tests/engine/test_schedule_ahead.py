"""Scheduling one step ahead (fsd.engine.ahead): the host lays out the next step while
the model runs this one, and no job's tokens, text or ending change.

On a CPU the model then runs on a thread of its own, so these tests run the real
overlap: the next step is scheduled while the model thread is inside the forward.
"""

from __future__ import annotations

import threading

import pytest
import torch

from fsd import LLM, SamplingParams
from fsd.config import EngineConfig
from fsd.engine.plan import build_plan, sub_plan
from fsd.errors import ConfigError
from fsd.jobs import PENDING
from fsd.sched.rules import MAX_ALPHA_SLOS

PROMPTS = [[(i * 13 + k) % 250 + 1 for k in range(n)] for i, n in enumerate([3, 40, 1, 17, 64, 9])]


def outputs(ahead: bool, prompts, params, **options):
    llm = LLM("tiny", num_gpu_blocks=256, seed=5, schedule_ahead=ahead, **options)
    assert llm.engine.executor.ahead is ahead
    outs = llm.generate(prompts, params)
    eng = llm.engine
    eng.blocks.check()
    assert eng.blocks.device.num_free == eng.blocks.device.num_blocks
    assert not eng.has_unfinished() and not eng.scheduler.has_unfinished()
    worker = eng.executor.worker
    llm.close()  # (the model thread's last step done: what it had to forget, forgotten)
    assert not worker.sampler._job_generators and len(worker._tables) == 0
    return [(o.token_ids, o.text, o.finish_reason, len(o.token_times)) for o in outs]


def test_every_kind_of_ending_and_sampling_gives_the_same_outputs_ahead():
    """Greedy, seeded random, min_tokens, EOS, stop tokens and stop strings: the same
    tokens, text and reasons, and no token of a step run past a job's end leaks out."""
    base = [SamplingParams(max_tokens=24, ignore_eos=True) for _ in PROMPTS]
    made = outputs(False, PROMPTS, base)
    params = [
        SamplingParams(max_tokens=24, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0.9, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=24, stop_token_ids=[made[2][0][6]], ignore_eos=True),
        SamplingParams(max_tokens=24, stop=[made[3][1][5:8]] if len(made[3][1]) > 8 else []),
        SamplingParams(max_tokens=24, min_tokens=4, stop_token_ids=[made[4][0][1]]),
        SamplingParams(max_tokens=1, ignore_eos=True),
    ]
    want = outputs(False, PROMPTS, params)
    assert want[2][2] == "stop" and len(want[2][0]) <= 7  # the stops were reached
    assert outputs(True, PROMPTS, params) == want


@pytest.mark.parametrize("kv_policy", ["recompute", "reactive", "proactive"])
def test_preemption_and_swaps_ahead_change_no_token(kv_policy):
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    alone = [outputs(False, [p], params)[0][0] for p in PROMPTS]
    options = {"policy": "sj-mlfq", "kv_policy": kv_policy, "num_host_blocks": 64,
               "max_batch_size": 4, "sj-mlfq.alpha": MAX_ALPHA_SLOS,
               "sj-mlfq.waiting_alpha": MAX_ALPHA_SLOS}  # fmt: skip
    llm = LLM("tiny", seed=5, schedule_ahead=True, **{**options, "num_gpu_blocks": 14})
    llm.engine.scheduler.observe_iteration = lambda *_: None  # type: ignore[method-assign]
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == alone
    assert sum(o.preemptions for o in outs) > 0
    if kv_policy != "recompute":
        assert sum(o.swaps_out for o in outs) > 0
    blocks = llm.engine.blocks
    blocks.check()
    assert blocks.device.num_free == 14 and blocks.host.num_free == 64
    llm.close()


def test_the_next_step_is_scheduled_while_the_model_runs_this_one():
    """The 3rd forward (laid out by the 3rd schedule) waits, up to 20 s, until the
    scheduler has been asked for the step after it: scheduled in step, that never
    happens before the forward returns, and the wait runs out."""
    llm = LLM("tiny", num_gpu_blocks=256, schedule_ahead=True)
    eng = llm.engine
    calls, overlapped, forwards = threading.Condition(), [], [0]
    schedules = [0]
    real_schedule, real_forward = eng.scheduler.schedule, eng.executor.worker.model.forward_stage

    def schedule(now, busy=()):
        with calls:
            schedules[0] += 1
            calls.notify_all()
        return real_schedule(now, busy)

    def forward(*args, **kwargs):
        forwards[0] += 1
        if forwards[0] == 3:  # a decode step: the 4th schedule lays out the next one
            with calls:
                overlapped.append(calls.wait_for(lambda: schedules[0] >= 4, timeout=20))
        return real_forward(*args, **kwargs)

    eng.scheduler.schedule = schedule  # type: ignore[method-assign]
    eng.executor.worker.model.forward_stage = forward
    out = llm.generate([1, 2, 3], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert overlapped == [True]
    assert len(out.token_ids) == 8 and PENDING not in out.token_ids
    llm.close()


def test_a_job_aborted_with_a_token_still_drawn_keeps_only_its_real_tokens():
    llm = LLM("tiny", num_gpu_blocks=256, schedule_ahead=True)
    eng = llm.engine
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    jobs = [eng.add_request(p, params) for p in PROMPTS[:3]]
    for _ in range(6):
        eng.step()
    assert jobs[0].pending  # settled ahead of its token
    out = eng.abort(jobs[0].job_id)
    assert out.finish_reason == "abort" and PENDING not in out.token_ids
    assert len(out.token_ids) == len(out.token_times)
    while eng.has_unfinished():
        eng.step()
    assert all(len(j.output_token_ids) == 50 for j in jobs[1:])
    eng.blocks.check()
    assert eng.blocks.device.num_free == eng.blocks.device.num_blocks
    llm.close()


def test_scheduling_ahead_needs_one_process():
    with pytest.raises(ConfigError, match="schedule_ahead needs tp = pp = 1"):
        EngineConfig.from_kwargs(schedule_ahead=True, tp=2)
    EngineConfig.from_kwargs(tp=2)  # unset: off there


def test_part_of_a_plan_is_the_plan_of_those_jobs():
    """The executor isolates a failing sequence with parts of the plan it has (the jobs
    may already be accounted one token on): each part is what laying its jobs out gives."""
    from fsd.jobs import Job

    jobs = []
    for i, n in enumerate([1, 1, 5, 3]):  # two decodes, two prefill chunks
        job = Job(prompt_token_ids=list(range(1, 9)), params=SamplingParams())
        job.job_id = f"j{i}"
        job.num_computed_tokens = 8 - n
        job.step_tokens = n
        job.block_table = [i, 10 + i]
        jobs.append(job)
    jobs[1].output_token_ids = [PENDING]
    jobs[1].num_computed_tokens = 8
    whole = build_plan(3, jobs)
    assert whole.pending == ((1, "j1"),)
    for lo, hi in [(0, 2), (2, 4), (1, 3), (0, 4)]:
        part = sub_plan(whole, range(lo, hi))
        alone = build_plan(3, [jobs[whole.order[k]] for k in range(lo, hi)])
        assert part == alone


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv_policy", ["defer", "proactive"])
def test_on_a_gpu_scheduling_ahead_changes_no_token(kv_policy):
    """CUDA graphs, the Triton kernels, tokens fed from the device and (proactive) copies
    beside the steps. One job per batch and quanta far below a step: jobs preempt each
    other all the time, and every step has the same shapes in both runs (the same
    kernels: the same tokens, bit for bit)."""
    params = [
        SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.8 * (i % 2), seed=i)
        for i in range(len(PROMPTS))
    ]
    options = dict(model="tiny", device="cuda", policy="sj-mlfq", kv_policy=kv_policy,
                   num_gpu_blocks=12, num_host_blocks=64, max_batch_size=1, seed=5, q1=0.001,
                   profile="opt-13b-a100")  # fmt: skip
    runs = []
    for ahead in (False, True):
        llm = LLM(schedule_ahead=ahead, **options)
        llm.engine.scheduler.observe_iteration = lambda *_: None  # type: ignore[method-assign]
        outs = llm.generate(PROMPTS, params)
        runs.append(([o.token_ids for o in outs], sum(o.preemptions for o in outs)))
        llm.close()
    assert runs[0][0] == runs[1][0]
    assert runs[1][1] > 0
