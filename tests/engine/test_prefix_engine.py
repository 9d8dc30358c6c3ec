"""The prefix cache in the real engine changes no token (greedy), wherever the shared
blocks are: on the device, copied back from the host, evicted for good, or held by
jobs being preempted and swapped."""

from __future__ import annotations

import pytest

from fsd import LLM, SamplingParams

BLOCK = 16
BASE = [(k * 37) % 251 + 1 for k in range(300)]
SHARED = [0, 1, 15, 16, 17, 300]  # tokens each prompt shares with BASE


def sharing(n: int, tail: int = 9) -> list[int]:
    """A prompt that shares its first `n` tokens with BASE, then differs."""
    return BASE[:n] + [(k * 11) % 241 + 3 for k in range(n, n + tail)]


PROMPTS = [sharing(n) for n in SHARED] + [list(BASE), BASE[:32], BASE[:32]]
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


def expected_cached(prompt: list[int]) -> int:
    """Full blocks shared with BASE (run first), less the last token of a prompt that
    is cached whole (it runs again for its logits)."""
    shared = 0
    while shared < min(len(prompt), len(BASE)) and prompt[shared] == BASE[shared]:
        shared += 1
    return min(shared // BLOCK * BLOCK, len(prompt) - 1)


@pytest.fixture(scope="module")
def uncached() -> list[list[int]]:
    llm = LLM("tiny", policy="fcfs", num_gpu_blocks=512, prefix_cache=False)
    return [llm.generate(p, PARAMS)[0].token_ids for p in [BASE, *PROMPTS]]


def run_one_by_one(llm: LLM) -> list:
    return [llm.generate(p, PARAMS)[0] for p in [BASE, *PROMPTS]]


def test_prompts_sharing_0_1_15_16_17_300_tokens_reuse_whole_blocks_and_match(uncached):
    llm = LLM("tiny", policy="fcfs", num_gpu_blocks=512)
    outs = run_one_by_one(llm)
    assert [o.token_ids for o in outs] == uncached
    assert [o.cached_tokens for o in outs[1:]] == [expected_cached(p) for p in PROMPTS]
    assert outs[-1].cached_tokens == 31  # a whole cached prompt: copy on write
    stats = llm.engine.blocks.prefix.stats()
    assert stats.hits >= sum(expected_cached(p) for p in PROMPTS) and stats.host_hits == 0
    llm.engine.blocks.check()


def run_evicting(num_host_blocks: int) -> tuple[LLM, list]:
    """BASE and each prompt on 24 device blocks, each followed by an unrelated long
    prompt that evicts what is idle: the LLM and the prompts' outputs."""
    llm = LLM("tiny", policy="fcfs", num_gpu_blocks=24, num_host_blocks=num_host_blocks)
    outs = []
    for p in [BASE, *PROMPTS]:
        outs.append(llm.generate(p, PARAMS)[0])
        llm.generate([250 - k % 200 for k in range(300)], PARAMS)  # evicts what is idle
    return llm, outs


def test_blocks_evicted_to_the_host_come_back_by_copy_and_match(uncached):
    # 24 device blocks: BASE's 19 are evicted by the next prompts and go to the host
    llm, outs = run_evicting(num_host_blocks=64)
    assert [o.token_ids for o in outs] == uncached
    stats = llm.engine.blocks.prefix.stats()
    assert stats.host_hits > 0 and stats.device_evictions > 0
    assert sum(o.cached_tokens for o in outs) > 0
    llm.engine.blocks.check()


def test_blocks_evicted_for_good_are_recomputed_and_match(uncached):
    llm, outs = run_evicting(num_host_blocks=4)
    assert [o.token_ids for o in outs] == uncached
    assert llm.engine.blocks.prefix.stats().host_evictions > 0
    llm.engine.blocks.check()


LONG = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def uncached_long() -> list[list[int]]:
    llm = LLM("tiny", policy="fcfs", num_gpu_blocks=512, prefix_cache=False)
    return [o.token_ids for o in llm.generate(PROMPTS, LONG)]


@pytest.mark.parametrize("kv_policy", ["recompute", "reactive", "proactive"])
def test_shared_blocks_under_preemption_and_swapping_match(uncached_long, kv_policy):
    """All prompts at once on 30 blocks, demoted at every quantum: jobs holding shared
    blocks are preempted, swapped out (or dropped) and resume."""
    llm = LLM(
        "tiny",
        policy="sj-mlfq",  # demoted at every quantum's end
        kv_policy=kv_policy,
        num_gpu_blocks=30,
        num_host_blocks=128,
        max_batch_size=4,
    )
    llm.generate(BASE, LONG)
    outs = llm.generate(PROMPTS, LONG)
    assert [o.token_ids for o in outs] == uncached_long
    assert sum(o.preemptions for o in outs) > 0
    assert sum(o.cached_tokens for o in outs) > 0
    blocks = llm.engine.blocks
    blocks.check()
    assert blocks.device.num_free == 30 and blocks.host.num_free == 128


def test_a_prefix_longer_than_the_device_pool_is_reused_as_far_as_it_fits(uncached):
    """BASE's 19 blocks cached on the host; a device of 12 blocks cannot take them all
    back, and the job still runs (recomputing the rest in chunks) and matches."""
    llm = LLM("tiny", policy="fcfs", num_gpu_blocks=24, num_host_blocks=64, prefill_chunk=64)
    llm.generate(BASE, PARAMS)
    llm.generate([250 - k % 200 for k in range(300)], PARAMS)
    out = llm.generate(list(BASE), PARAMS)[0]
    assert out.token_ids == uncached[PROMPTS.index(BASE) + 1]
    llm.engine.blocks.check()


def test_turning_the_cache_off_live_keeps_every_job_correct(uncached):
    llm = LLM("tiny", policy="fcfs", num_gpu_blocks=512, max_batch_size=4)
    eng = llm.engine
    llm.generate(BASE, PARAMS)
    jobs = [eng.add_request(p, PARAMS) for p in PROMPTS]
    for _ in range(3):
        eng.step()  # some now hold shared blocks
    assert any(j.num_cached_tokens for j in jobs)
    eng.retune(prefix_cache=False)
    while eng.has_unfinished():
        eng.step()
    assert [j.output_token_ids for j in jobs] == uncached[1:]
    assert eng.blocks.prefix.stats().device_blocks == 0
    eng.blocks.check()
    again = llm.generate(BASE, PARAMS)[0]
    assert again.cached_tokens == 0 and again.token_ids == uncached[0]
