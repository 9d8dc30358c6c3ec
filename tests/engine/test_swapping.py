"""Preemption and KV swapping in the real engine change no token (greedy)."""

from __future__ import annotations

import pytest
import torch

from fsd import LLM, SamplingParams
from fsd.sched.rules import MAX_ALPHA_SLOS

PROMPTS = [
    [(i * 13 + k) % 250 + 1 for k in range(n)] for i, n in enumerate([3, 40, 1, 17, 64, 9, 30])
]
PARAMS = SamplingParams(max_tokens=40, ignore_eos=True)


def small_pool(kv_policy: str, **options: object) -> LLM:
    """sj-mlfq on 14 device blocks, batch of 4: the seven prompts must preempt.

    Service is charged in the profile's seconds and nothing starves within the run,
    so the preemptions come from the quanta alone, not from how busy the machine is
    (wall-clock promotions once left the defer case without a single drop)."""
    options = {"sj-mlfq.alpha": MAX_ALPHA_SLOS, "sj-mlfq.waiting_alpha": MAX_ALPHA_SLOS, **options}
    llm = LLM(
        "tiny",
        policy="sj-mlfq",
        kv_policy=kv_policy,
        num_gpu_blocks=14,
        num_host_blocks=64,
        max_batch_size=4,
        **options,
    )
    llm.engine.scheduler.observe_iteration = lambda *_: None  # type: ignore[method-assign]
    return llm


@pytest.fixture(scope="module")
def alone() -> list[list[int]]:
    llm = LLM("tiny", policy="fcfs", num_gpu_blocks=512)
    return [llm.generate(p, PARAMS)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize("kv_policy", ["defer", "recompute", "reactive", "proactive"])
def test_sj_mlfq_under_a_small_device_pool_matches_each_prompt_run_alone(alone, kv_policy):
    # sj-mlfq's demotion at every quantum's end (a fresh Gittins rule would keep alike
    # jobs in place) is the churn that forces preemption here
    llm = small_pool(kv_policy)
    outs = llm.generate(PROMPTS, PARAMS)
    assert [o.token_ids for o in outs] == alone
    assert sum(o.preemptions for o in outs) > 0
    swaps_out = sum(o.swaps_out for o in outs)
    recomputes = sum(o.recomputes for o in outs)
    if kv_policy in ("reactive", "proactive"):
        assert swaps_out > 0 and recomputes == 0
        assert sum(o.swaps_in for o in outs) == swaps_out  # every job came back
    else:
        assert swaps_out == 0 and recomputes > 0
    blocks = llm.engine.blocks
    blocks.check()
    assert blocks.device.num_free == 14 and blocks.host.num_free == 64
    assert not llm.engine.swapper.busy


def test_a_swapped_out_job_really_leaves_the_device_and_comes_back_intact():
    # No prefix cache: with it, the swapped-out job's full blocks stay on the device as
    # cached blocks and come back without a copy (tests/engine/test_prefix_engine.py).
    llm = LLM(
        "tiny",
        policy="sj-mlfq",
        kv_policy="reactive",
        num_gpu_blocks=64,
        num_host_blocks=64,
        prefix_cache=False,
    )
    eng = llm.engine
    job = eng.add_request(PROMPTS[4], PARAMS)
    for _ in range(3):
        eng.step()
    layer0_k = eng.pool.layers[0][0]
    before = layer0_k[job.block_table].clone()
    src = list(job.block_table)
    op = eng.blocks.swap_out(job, sync=True)  # a sync copy: accounted done at once
    eng.swapper.run_sync([op])
    layer0_k[src] = 0.0  # the device copy is gone
    host = eng.host_pool.data[op.dst]  # [n, L, 2, BS, H, D]
    assert torch.equal(host[:, 0, 0], before)
    back = eng.blocks.swap_in(job, sync=True)
    eng.swapper.run_sync([back])
    assert torch.equal(layer0_k[job.block_table], before)


def test_proactive_copies_run_asynchronously_beside_the_step():
    # (no prefix cache: its evicted blocks would go to the host too, and never come back)
    llm = small_pool("proactive", prefix_cache=False)
    eng = llm.engine
    for p in PROMPTS:
        eng.add_request(p, PARAMS)
    async_ops = 0
    while eng.has_unfinished():
        eng.step()
        out = eng.last_schedule
        if out is not None:
            async_ops += sum(1 for op in out.swap_out + out.swap_in if not op.sync)
    assert async_ops > 0
    assert eng.swapper.bytes_out > 0 and eng.swapper.bytes_in == eng.swapper.bytes_out


def test_a_sync_swap_out_into_host_blocks_a_swap_in_just_left_copies_after_it():
    # A small host pool makes iteration 7's sync swap-out of the third job take a host
    # block that the second job's sync swap-in frees in the same iteration. Copied
    # outs-first, the swap-in read the overwritten block and the job's tokens changed.
    prompts = [[(i * 13 + k) % 250 + 1 for k in range(n)] for i, n in enumerate([7, 15, 9])]
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (7, 13, 5)]
    single = LLM("tiny", policy="fcfs", num_gpu_blocks=512, block_size=4)
    alone = [single.generate(p, sp)[0].token_ids for p, sp in zip(prompts, params, strict=True)]
    llm = LLM(
        "tiny",
        policy="fcfs",
        kv_policy="reactive",
        num_gpu_blocks=7,
        num_host_blocks=6,
        block_size=4,
        max_batch_size=3,
    )
    eng = llm.engine
    jobs, reused = [], False
    for step in range(200):
        if step in (0, 3, 6):
            i = (0, 3, 6).index(step)
            jobs.append(eng.add_request(prompts[i], params[i]))
        eng.step()
        out = eng.last_schedule
        if out is not None:
            freed = {b for op in out.sync_ops if op.direction == "in" for b in op.src}
            taken = {b for op in out.sync_ops if op.direction == "out" for b in op.dst}
            reused |= bool(freed & taken)
        if len(jobs) == 3 and not eng.has_unfinished():
            break
    assert reused  # the case this test is about happened
    assert [j.output_token_ids for j in jobs] == alone


def test_a_failed_async_copy_fails_its_job_only(alone, monkeypatch):
    from fsd.engine.swapper import Swapper

    llm = small_pool("proactive")
    real = Swapper._copy
    doomed: list[str] = []

    def copy(self, op, keep):  # the first job copied asynchronously loses its KV
        if not op.sync and (not doomed or doomed[0] == op.job.job_id):
            doomed[:1] = [op.job.job_id]
            raise OSError("DMA engine on fire")
        return real(self, op, keep)

    monkeypatch.setattr(Swapper, "_copy", copy)
    outs = llm.generate(PROMPTS, PARAMS)
    assert doomed, "no asynchronous copy happened"
    for out, want in zip(outs, alone, strict=True):
        if out.request_id == doomed[0]:
            assert out.finish_reason == "error" and "DMA engine on fire" in out.error
        else:
            assert out.finish_reason == "length" and out.token_ids == want
    blocks = llm.engine.blocks
    blocks.check()
    assert blocks.device.num_free == 14 and blocks.host.num_free == 64
    assert not llm.engine.swapper.busy


def test_steps_go_on_while_a_proactive_copy_is_held_and_the_tokens_do_not_change(alone):
    """The copier is held on its first swap-out; meanwhile the engine keeps stepping the
    jobs whose KV it does not move (no step waits for the copy), and once it is let go
    every job ends with the tokens it makes alone."""
    import threading

    from fsd.engine.swap_staging import Staging

    llm = small_pool("proactive", prefix_cache=False)
    eng = llm.engine
    real, held, go = Staging.copy, threading.Event(), threading.Event()

    def copy(self, direction, src, dst):
        if direction == "out" and not held.is_set():
            held.set()
            go.wait(30)
        return real(self, direction, src, dst)

    jobs = [eng.add_request(p, PARAMS) for p in PROMPTS]
    stepped_while_held = 0
    try:
        Staging.copy = copy  # type: ignore[method-assign]
        for _ in range(2000):
            if not eng.has_unfinished():
                break
            made = eng.step()
            if held.is_set() and not go.is_set():
                stepped_while_held += bool(made)
                assert eng.swapper.busy  # the copy is still out there
                if stepped_while_held >= 3:
                    go.set()
    finally:
        go.set()
        Staging.copy = real  # type: ignore[method-assign]
    assert held.is_set() and stepped_while_held >= 3
    assert [j.output_token_ids for j in jobs] == alone
