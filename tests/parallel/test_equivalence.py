"""TP=2, PP=2 and TP=2 x PP=2 on Ray CPU actors give the tokens of one device.

Every run uses a device pool too small for the batch, so jobs are preempted and
their KV is swapped out and back in (each stage and rank moving its own shard);
each prompt's tokens must still equal its run alone on a single device, greedy and
with per-job seeds.
"""

from __future__ import annotations

import pytest

from fsd import LLM, SamplingParams

PROMPTS = [
    [(i * 13 + k) % 250 + 1 for k in range(n)] for i, n in enumerate([3, 40, 1, 17, 64, 9, 30])
]
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)
SEEDED = [SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.8, seed=s) for s in (7, 8)]
PARAMS = [GREEDY] * 5 + SEEDED  # two sampled rows: logits come back and the driver samples
SMALL_POOL = {"num_gpu_blocks": 14, "num_host_blocks": 64, "max_batch_size": 4}


@pytest.fixture(scope="module")
def alone(profile_path) -> dict[str, list[list[int]]]:
    """Each prompt run by itself on one device, per model."""
    out = {}
    for model in ("tiny-opt", "tiny"):
        with LLM(model, policy="fcfs", num_gpu_blocks=512, profile=profile_path) as llm:
            out[model] = [
                llm.generate(p, sp)[0].token_ids for p, sp in zip(PROMPTS, PARAMS, strict=True)
            ]
    return out


@pytest.mark.parametrize(
    ("model", "tp", "pp", "kv_policy"),
    [
        # each model alone on TP or PP and on TP x PP; each KV policy that copies, on both
        ("tiny-opt", 2, 1, "reactive"),
        ("tiny-opt", 2, 2, "proactive"),
        ("tiny", 1, 2, "reactive"),
        ("tiny", 2, 2, "proactive"),
    ],
)
def test_sharded_tokens_equal_one_device_under_preemption_and_swapping(
    ray_cluster, cpu_llm, alone, model, tp, pp, kv_policy
):
    # demotion churn (sj-mlfq's rule) forces the preemption and swapping
    # every byte out comes back in (test_prefix_sharded has the cache)
    with cpu_llm(
        model, tp=tp, pp=pp, policy="sj-mlfq", kv_policy=kv_policy, prefix_cache=False,
        **SMALL_POOL,
    ) as llm:
        outs = llm.generate(PROMPTS, PARAMS)
        assert [o.token_ids for o in outs] == alone[model]
        assert all(o.finish_reason == "length" for o in outs)
        if pp == 1:  # with micro-batches in flight the scheduler counts no preemptions
            assert sum(o.preemptions for o in outs) > 0
        swaps_out = sum(o.swaps_out for o in outs)
        assert swaps_out > 0 and sum(o.swaps_in for o in outs) == swaps_out
        blocks = llm.engine.blocks
        blocks.check()
        assert blocks.device.num_free == 14 and blocks.host.num_free == 64
        assert llm.engine.swapper.bytes_out > 0
        assert llm.engine.swapper.bytes_in == llm.engine.swapper.bytes_out
        assert not llm.engine.has_unfinished()


CHUNK_PROMPTS = [
    [(i * 17 + k) % 250 + 1 for k in range(n)] for i, n in enumerate([150, 70, 33, 5, 97])
]
CHUNK_PARAMS = [SamplingParams(max_tokens=12, ignore_eos=True)] * 4 + [SEEDED[0]]


@pytest.fixture(scope="module")
def unchunked(cpu_llm) -> list[list[int]]:
    """The chunked-prefill prompts on one device, in process, with chunking off."""
    with cpu_llm("tiny-opt", prefill_chunk=0, num_gpu_blocks=512) as llm:
        return [o.token_ids for o in llm.generate(CHUNK_PROMPTS, CHUNK_PARAMS)]


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_sharded_chunked_prefill_equals_one_device_unchunked(
    ray_cluster, cpu_llm, unchunked, tp, pp
):
    """Prompts longer than the chunk go in 32 tokens an iteration (some iterations carry
    only a chunk that draws nothing); every shard fills its KV from where it stopped."""
    with cpu_llm(
        "tiny-opt", tp=tp, pp=pp, prefill_chunk=32, block_size=16, num_gpu_blocks=64,
        num_host_blocks=16,
    ) as llm:
        eng = llm.engine
        jobs = [eng.add_request(p, sp) for p, sp in zip(CHUNK_PROMPTS, CHUNK_PARAMS, strict=True)]
        partial = 0
        while eng.has_unfinished():
            before = {j.job_id: j.num_computed_tokens for j in jobs}
            eng.step()
            out = eng.last_schedule
            if out is None:
                continue
            for job in out.batch:
                assert job.step_tokens <= 32
                if before[job.job_id] + job.step_tokens < job.num_prompt_tokens:
                    partial += 1
        assert partial >= 150 // 32  # the long prompts really went in chunks
        assert [j.output_token_ids for j in jobs] == unchunked
        assert all(j.finish_reason.value == "length" for j in jobs)
        blocks = eng.blocks
        blocks.check()
        assert blocks.device.num_free == 64 and blocks.host.num_free == 16


@pytest.mark.parametrize(
    ("tp", "pp", "kv_policy"), [(2, 1, "reactive"), (1, 2, "proactive"), (1, 2, "recompute")]
)
def test_sharded_chunked_prefill_under_preemption_equals_one_device_unchunked(
    ray_cluster, cpu_llm, unchunked, tp, pp, kv_policy
):
    """Chunks beside demotion churn on 14 blocks: half-prefilled jobs are swapped out or
    dropped (with pp = 2, while other micro-batches are in flight) and resume."""
    # fsd's rules less the swap gate, demoting always, no threshold: the churn this needs
    churn = {"fsd.swap_gate": False, "fsd.demote": "always", "fsd.threshold": 0}
    with cpu_llm(
        "tiny-opt", tp=tp, pp=pp, policy="fsd", kv_policy=kv_policy, prefill_chunk=16,
        **churn, **SMALL_POOL,
    ) as llm:
        outs = llm.generate(CHUNK_PROMPTS, CHUNK_PARAMS)
        assert [o.token_ids for o in outs] == unchunked
        if kv_policy == "recompute":
            assert sum(o.recomputes for o in outs) > 0
        else:
            assert sum(o.swaps_out for o in outs) > 0
            assert sum(o.swaps_in for o in outs) == sum(o.swaps_out for o in outs)
        blocks = llm.engine.blocks
        blocks.check()
        assert blocks.device.num_free == 14 and blocks.host.num_free == 64
