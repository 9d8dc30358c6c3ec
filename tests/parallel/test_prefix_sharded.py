"""TP=2 and PP=2 with the prefix cache: shared blocks, copies back from the host and
copies on write run on every rank and stage, and the tokens equal one device's
without the cache."""

from __future__ import annotations

import pytest

from fsd import LLM, SamplingParams

BASE = [(k * 37) % 251 + 1 for k in range(120)]
PROMPTS = [BASE[:n] + [(k * 11) % 241 + 3 for k in range(9)] for n in (0, 1, 15, 16, 17, 120)]
PROMPTS += [BASE[:32], BASE[:32]]  # cached whole: copy on write
PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)
FILLER = [250 - k % 200 for k in range(120)]  # evicts what is idle (to the host)


@pytest.fixture(scope="module")
def reference(profile_path) -> list[list[int]]:
    with LLM(
        "tiny", policy="fcfs", num_gpu_blocks=512, prefix_cache=False, profile=profile_path
    ) as llm:
        return [llm.generate(p, PARAMS)[0].token_ids for p in [BASE, *PROMPTS]]


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_sharded_prefix_reuse_matches_one_device_without_the_cache(
    ray_cluster, cpu_llm, reference, tp, pp
):
    with cpu_llm("tiny", tp=tp, pp=pp, num_gpu_blocks=16, num_host_blocks=64) as llm:
        outs = []
        for p in [BASE, *PROMPTS]:
            outs.append(llm.generate(p, PARAMS)[0])
            llm.generate(FILLER, PARAMS)
        together = llm.generate(PROMPTS, PARAMS)  # at once: shared blocks, preemption
        assert [o.token_ids for o in outs] == reference
        assert [o.token_ids for o in together] == reference[1:]
        stats = llm.engine.blocks.prefix.stats()
        assert stats.host_hits > 0 and stats.hits > stats.host_hits
        assert any(o.cached_tokens == 31 for o in outs)  # copy on write ran
        blocks = llm.engine.blocks
        blocks.check()
        assert blocks.device.num_free == 16 and blocks.host.num_free == 64
