"""The engine end to end on CPU: equal to HF transformers, batch-invariant, leak-free."""

from __future__ import annotations

import pytest

from fsd import LLM, SamplingParams
from fsd.errors import ConfigError, PromptTooLongError, UnknownJobError
from tests.models.hf_fixtures import (
    hf_logits,
    load_hf_model,
    make_llama_checkpoint,
    make_opt_checkpoint,
)

GREEDY32 = SamplingParams(max_tokens=32, ignore_eos=True)


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(hf_logits(model, ids + out)[-1].argmax()))
    return out


def assert_pool_free(llm: LLM) -> None:
    blocks = llm.engine.blocks
    blocks.check()
    assert blocks.num_free == blocks.device.num_blocks
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize("family", ["opt", "llama"])
def test_32_greedy_tokens_equal_hf_transformers(tmp_path, family):
    make = make_opt_checkpoint if family == "opt" else make_llama_checkpoint
    path = make(tmp_path / family, seed=3)
    hf = load_hf_model(path)
    llm = LLM(str(path), dtype="float32", block_size=4, num_gpu_blocks=64)
    prompts = [[5, 17, 99, 42], [8] * 11, [120, 3, 64, 77, 200, 31, 9]]
    outs = llm.generate(prompts, GREEDY32)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(hf, prompt, 32)
        assert out.finish_reason == "length"
    assert_pool_free(llm)


def test_text_prompt_uses_the_checkpoint_tokenizer(tmp_path):
    path = make_llama_checkpoint(tmp_path / "llama")
    llm = LLM(str(path), dtype="float32", num_gpu_blocks=32)
    out = llm.generate("hi there", SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert out.prompt_token_ids == llm.tokenizer.encode("hi there")
    assert out.prompt_token_ids[0] == llm.tokenizer.bos_token_id
    assert out.text == llm.tokenizer.decode(out.token_ids)


@pytest.fixture(scope="module")
def tiny() -> LLM:
    return LLM("tiny", max_batch_size=8, num_gpu_blocks=512, block_size=16)


MIXED = [
    [(i * 7 + k) % 250 + 1 for k in range(n)] for i, n in enumerate([3, 40, 1, 17, 64, 9, 33, 120])
]


def test_batch_invariance_alone_equals_inside_a_batch_of_eight(tiny):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    together = tiny.generate(MIXED, params)
    for prompt, out in zip(MIXED, together, strict=True):
        assert tiny.generate(prompt, params)[0].token_ids == out.token_ids
    assert_pool_free(tiny)


def test_recompute_preemption_in_a_small_pool_changes_no_token(tiny):
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompts = MIXED[:6]
    expected = [o.token_ids for o in tiny.generate(prompts, params)]
    small = LLM("tiny", policy="fcfs", kv_policy="recompute", max_batch_size=8, num_gpu_blocks=14)
    outs = small.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.recomputes for o in outs) > 0
    assert all(o.preemptions >= o.recomputes for o in outs)
    assert_pool_free(small)


def test_outputs_carry_monotonic_per_token_timestamps(tiny):
    out = tiny.generate([1, 2, 3], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    assert len(out.token_times) == len(out.token_ids) == 10
    assert out.token_times == sorted(out.token_times)
    assert out.arrival_time <= out.first_token_time == out.token_times[0]
    assert out.finish_time == out.token_times[-1] and out.ttft >= 0


def test_stop_token_ids_min_tokens_and_max_tokens(tiny):
    free = tiny.generate([4, 5, 6], SamplingParams(max_tokens=20, ignore_eos=True))[0].token_ids
    stop_at = free[5]
    first = free.index(stop_at)
    out = tiny.generate([4, 5, 6], SamplingParams(max_tokens=20, stop_token_ids=[stop_at]))[0]
    assert out.token_ids == free[: first + 1] and out.finish_reason == "stop"
    late = tiny.generate(
        [4, 5, 6], SamplingParams(max_tokens=20, stop_token_ids=[stop_at], min_tokens=first + 2)
    )[0]
    assert len(late.token_ids) >= first + 2 and stop_at not in late.token_ids[: first + 2]


def test_eos_ends_a_job_unless_ignored_or_before_min_tokens():
    llm = LLM("tiny", num_gpu_blocks=64)
    free = llm.generate([9, 9, 9], SamplingParams(max_tokens=20, ignore_eos=True))[0].token_ids
    eos = free[4]
    first = free.index(eos)
    # Make a token the random model really produces act as the tokenizer's EOS.
    llm.engine.eos_ids = frozenset({eos})
    llm.engine.executor.eos_ids = (eos,)
    stopped = llm.generate([9, 9, 9], SamplingParams(max_tokens=20))[0]
    assert stopped.token_ids == free[: first + 1] and stopped.finish_reason == "stop"
    ignored = llm.generate([9, 9, 9], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    assert ignored.token_ids == free and ignored.finish_reason == "length"
    held = llm.generate([9, 9, 9], SamplingParams(max_tokens=20, min_tokens=first + 1))[0]
    assert eos not in held.token_ids[: first + 1]


def test_stop_string_truncates_text_and_never_streams_it(tiny):
    prompt = "stop strings "
    free = tiny.generate(prompt, SamplingParams(max_tokens=40, ignore_eos=True))[0]
    assert len(free.text) > 6
    stop = free.text[3:5]
    streamed = "".join(
        d.new_text
        for d in tiny.stream(prompt, SamplingParams(max_tokens=40, ignore_eos=True, stop=[stop]))
    )
    assert stop not in streamed
    assert streamed == free.text[: free.text.index(stop)]


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny):
    p = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True)
    alone = tiny.generate([11, 12, 13], p)[0].token_ids
    mixed = tiny.generate(
        [[1, 2], [11, 12, 13], [7] * 30], [SamplingParams(max_tokens=5, temperature=1.0), p, p]
    )
    assert mixed[1].token_ids == alone
    other = tiny.generate([11, 12, 13], SamplingParams(**{**p.__dict__, "seed": 99}))[0]
    assert other.token_ids != alone


def test_abort_frees_blocks_and_unknown_ids_are_refused(tiny):
    eng = tiny.engine
    job = eng.add_request([1] * 40, SamplingParams(max_tokens=50))
    # the prefill budget is derived from the profile calibrated at start, so on a busy
    # machine the prompt may run as two chunks: step until its first token
    for _ in range(4):
        eng.step()
        if job.num_output_tokens:
            break
    assert job.block_table
    out = eng.abort(job.job_id)
    assert out.finish_reason == "abort" and len(out.token_ids) == 1
    assert_pool_free(tiny)
    with pytest.raises(UnknownJobError, match="no job with id 'nope'"):
        eng.abort("nope")


def test_bad_input_gets_clear_errors_and_the_engine_keeps_working(tiny):
    eng = tiny.engine
    with pytest.raises(PromptTooLongError, match="context is"):
        eng.add_request([1] * eng.max_model_len)
    with pytest.raises(ConfigError, match="empty"):
        eng.add_request("")
    with pytest.raises(ConfigError, match="token ids"):
        eng.add_request([1, -4, 10**9])
    small = LLM("tiny", num_gpu_blocks=2, block_size=16)
    with pytest.raises(PromptTooLongError, match="needs 3 KV blocks; the device pool has 2"):
        small.engine.add_request([1] * 40, SamplingParams(max_tokens=4))
    assert tiny.generate([1, 2], SamplingParams(max_tokens=3))[0].token_ids
    assert_pool_free(tiny)


def test_a_max_tokens_past_the_context_is_refused_for_a_client_and_clipped_offline(tiny):
    eng = tiny.engine
    ctx = eng.max_model_len
    huge = SamplingParams(max_tokens=10**9)
    with pytest.raises(
        PromptTooLongError, match=f"context of {ctx} tokens; ask for at most {ctx - 3} output"
    ):
        eng.add_request([1, 2, 3], huge, clip=False)  # a client's request (the daemon's)
    fits = eng.add_request([1, 2, 3], SamplingParams(max_tokens=ctx - 3), clip=False)
    assert fits.max_output == ctx - 3
    clipped = eng.add_request([1, 2, 3], huge)  # offline: "up to the context"
    assert clipped.max_output == ctx - 3
    for job in (fits, clipped):
        eng.abort(job.job_id)
    assert_pool_free(tiny)


def test_unknown_policy_and_options_fail_before_loading():
    with pytest.raises(ConfigError, match="unknown policy 'lottery'"):
        LLM("tiny", policy="lottery")
    with pytest.raises(ConfigError, match="unknown engine option"):
        LLM("tiny", nmu_gpu_blocks=3)
