"""A Mistral checkpoint served over TP=2 x PP=2 Ray CPU actors gives HF's greedy tokens.

Every family's sharded arithmetic (q/k/v biases split by heads for Qwen2, per-head
q/k norms whole on each rank for Qwen3, layers split over two stages) is checked
against HF on two gloo ranks in tests/models/test_hf_equivalence.py, for the price
of one process pair. Here the whole engine runs one family on four Ray actors (an
engine setup costs ~20 s on two cores, so one family, not three): Mistral, whose
sliding window the driver enforces. Its context stops at the window and a longer
prompt is refused with an error naming it.
"""

from __future__ import annotations

import pytest

from fsd import SamplingParams
from fsd.errors import PromptTooLongError
from tests.models.hf_fixtures import hf_greedy, load_hf_model, make_checkpoint, random_tokens

WINDOW = 48
PROMPTS = [random_tokens(n, seed) for seed, n in enumerate((3, 17, 30))]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


def test_mistral_over_tp2_pp2_equals_hf_up_to_its_window(ray_cluster, cpu_llm, tmp_path):
    path = make_checkpoint(tmp_path / "mistral", "mistral", sliding_window=WINDOW)
    with cpu_llm(str(path), tp=2, pp=2, block_size=4, num_gpu_blocks=64, num_host_blocks=8) as llm:
        assert llm.engine.max_model_len == WINDOW
        outs = llm.generate(PROMPTS, GREEDY)
        with pytest.raises(PromptTooLongError, match=f"{WINDOW}-token window"):
            llm.engine.add_request([3] * WINDOW)
    hf = load_hf_model(path)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.finish_reason == "length"  # the last prompt runs into the window
        assert out.token_ids == hf_greedy(hf, prompt, min(24, WINDOW - len(prompt)))
