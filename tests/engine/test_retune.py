"""Live retune between iterations: settings change, no job is lost or altered."""

from __future__ import annotations

import pytest

from fsd import LLM, SamplingParams
from fsd.errors import ConfigError, PromptTooLongError

PROMPTS = [[(i * 11 + k) % 250 + 1 for k in range(n)] for i, n in enumerate([5, 33, 2, 18, 50])]
PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


def run_with_retunes(llm: LLM, retunes: dict[int, dict]) -> list[list[int]]:
    eng = llm.engine
    jobs = [eng.add_request(p, PARAMS) for p in PROMPTS]
    done: dict[str, list[int]] = {}
    step = 0
    while eng.has_unfinished():
        if step in retunes:
            eng.retune(**retunes[step])
        for d in eng.step():
            if d.output is not None:
                done[d.job_id] = d.output.token_ids
        step += 1
    eng.blocks.check()
    assert eng.blocks.device.num_free == eng.blocks.device.num_blocks
    return [done[j.job_id] for j in jobs]


def test_retuning_policy_quanta_alpha_and_kv_policy_mid_run_changes_no_token():
    base = LLM("tiny", policy="fcfs", num_gpu_blocks=256).generate(PROMPTS, PARAMS)
    llm = LLM("tiny", policy="sj-mlfq", num_gpu_blocks=12, num_host_blocks=64, max_batch_size=3)
    retunes = {
        2: {"quanta": (0.001, 0.002, 0.004), "sj-mlfq.alpha": 50.0},
        5: {"policy": "fcfs", "kv_policy": "recompute"},
        9: {"policy": "mlfq", "q1": 0.01, "quantum_ratio": 3.0, "kv_policy": "reactive"},
        14: {"policy": "sj-mlfq", "max_batch_size": 2, "reserve_min_jobs": 2},
        17: {"admit_fraction": 0.3},
    }
    assert run_with_retunes(llm, retunes) == [o.token_ids for o in base]
    cfg = llm.engine.config
    assert cfg.sched.policy == "sj-mlfq" and cfg.sched.max_batch_size == 2
    assert dict(cfg.sched.policy_settings) == {"sj-mlfq.alpha": 50.0}  # kept across policies
    assert cfg.cache.kv_policy == "reactive" and cfg.cache.reserve_min_jobs == 2
    assert cfg.cache.admit_fraction == llm.engine.scheduler.cache.admit_fraction == 0.3


def test_same_policy_retune_keeps_levels_and_clips_removed_ones():
    llm = LLM("tiny", policy="sj-mlfq", num_gpu_blocks=64, quanta=(1e-9, 2e-9, 4e-9, 8e-9))
    eng = llm.engine
    job = eng.add_request([1] * 40, PARAMS)
    for _ in range(4):
        eng.step()
    assert job.level == 3
    eng.retune(quanta=(1.0, 2.0))
    assert job.level == 1 and eng.scheduler.queue.quanta == [1.0, 2.0]
    assert eng.scheduler.get(job.job_id) is job


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"policy": "lottery"}, "unknown policy"),
        ({"policy": "srpt"}, "simulator only"),
        ({"quanta": (2.0, 1.0)}, "strictly increasing"),
        ({"fsd.alpha": 0}, r"fsd setting alpha must be in \(0, 1e\+06\] SLOs, got 0"),
        ({"fsd.threshold": 300}, r"fsd setting threshold must be in \[0, 256\] levels"),
        ({"fsd.promote": "down"}, "fsd setting promote must be one of"),
        ({"fsd.alpah": 5}, r"unknown setting fsd.alpah \(did you mean fsd.alpha\?\)"),
        ({"starve_limit": 5}, "unknown setting starve_limit"),
        ({"kv_policy": "magic"}, "kv_policy"),
        ({"admit_fraction": 0}, "admit_fraction"),
        ({"block_size": 8}, "cannot retune block_size while running: fixed when"),
        ({"nosuchkey": 1}, "unknown setting nosuchkey; retunable: admit_fraction, "),
        ({"max_batch_sise": 1}, r"unknown setting max_batch_sise \(did you mean max_batch_size\?\)"),
        ({"q1": "5ms"}, "q1 must be a number or none, got '5ms'"),
        ({"q1": float("nan")}, "q1 must be a finite number"),
        ({"quanta": (0.1, float("inf"))}, "quanta must be a finite number"),
        ({"num_levels": 1100}, "num_levels must be in 1..256"),
        ({"quantum_ratio": 1e200}, "overflows the last quantum"),
    ],
)
def test_invalid_retunes_are_refused_and_change_nothing(changes, match):
    llm = LLM("tiny", num_gpu_blocks=32)
    before = llm.engine.config
    with pytest.raises(ConfigError, match=match):
        llm.engine.retune(**changes)
    assert llm.engine.config == before
    assert llm.engine.scheduler.config == before.sched
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2))[0].token_ids


def test_a_prompt_queued_before_the_batch_token_limit_fell_below_it_runs_alone():
    llm = LLM("tiny", num_gpu_blocks=32, prefill_chunk=0)  # whole prefills
    eng = llm.engine
    long_job = eng.add_request([7] * 40, PARAMS)
    eng.retune(max_batch_tokens=16)
    short = eng.add_request([3] * 8, PARAMS)
    with pytest.raises(PromptTooLongError, match="max_batch_tokens"):  # new ones are checked
        eng.add_request([7] * 40, PARAMS)
    batches = []
    while eng.has_unfinished():
        eng.step()
        batches.append([j.job_id for j in eng.last_schedule.batch])
    assert len(long_job.output_token_ids) == len(short.output_token_ids) == PARAMS.max_tokens
    assert [long_job.job_id] in batches  # its 40-token prefill went alone


def test_a_retune_to_the_current_settings_changes_no_state() -> None:
    """Same values: nothing is rebuilt (the queue's preemption memory, the KV policy)."""
    llm = LLM("tiny", num_gpu_blocks=64, max_batch_size=2)
    eng = llm.engine
    for p in PROMPTS:
        eng.add_request(p, PARAMS)
    for _ in range(3):
        eng.step()
    sched = eng.scheduler
    queue, kv_policy, lifted = sched.queue, sched.kv_policy, sched.queue._lifted
    cfg = eng.config
    eng.retune(policy=cfg.sched.policy, kv_policy=cfg.cache.kv_policy)
    assert sched.queue is queue and sched.kv_policy is kv_policy
    assert sched.queue._lifted is lifted
    eng.retune(kv_policy="recompute")  # a real change still takes effect
    assert sched.kv_policy is not kv_policy and eng.config.cache.kv_policy == "recompute"
