"""Qwen2, Qwen3 and Mistral: fsd's Llama family with flags equals transformers.

Each family is a tiny random HF checkpoint written here (config, safetensors,
tokenizer) and loaded by fsd: logits equal HF's (fp32) through prefill chunks,
decodes and a mixed batch, and 32 greedy tokens are HF's. Mistral's sliding window
caps the context fsd serves, with errors that name the window.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from fsd import LLM, SamplingParams
from fsd.config import ModelConfig
from fsd.cost import CostModel
from fsd.errors import ConfigError, ModelLoadError, PromptTooLongError
from fsd.models.hf_config import arch_from_hf_config
from fsd.models.loader import load_model
from fsd.models.presets import get_preset
from tests.models.hf_fixtures import (
    PagedRunner,
    assert_logits_close,
    hf_greedy,
    hf_logits,
    load_hf_model,
    make_checkpoint,
    random_tokens,
)

ATOL = RTOL = 1e-5
WINDOW = 64  # the Mistral checkpoint's sliding window, below its 128 positions

FAMILIES = {
    "qwen2": {"tie_word_embeddings": True},  # as Qwen2.5-0.5B
    "qwen3": {},  # head_dim 24, not hidden / heads
    "mistral": {"sliding_window": WINDOW},
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """family -> its checkpoint directory, written once per module."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = make_checkpoint(tmp_path_factory.mktemp(name), name, **FAMILIES[name])
        return made[name]

    return get


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, checkpoint):
    path = checkpoint(request.param)
    lm = load_model(ModelConfig(model=str(path), device="cpu", dtype="auto"))
    return request.param, path, lm, load_hf_model(path)


def _close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert_logits_close(ours, ref, atol=ATOL, rtol=RTOL)


def test_the_config_sets_the_familys_flags(family):
    name, _, lm, hf = family
    a = lm.arch
    assert (a.family, a.model_type) == ("llama", name)
    assert a.head_dim == (24 if name == "qwen3" else 16) and a.num_kv_heads == 2
    assert a.qkv_bias == (name == "qwen2") and not a.attention_bias
    assert a.qk_norm == (name == "qwen3")
    assert a.sliding_window == (WINDOW if name == "mistral" else None)
    assert lm.max_model_len == (WINDOW if name == "mistral" else 128)
    assert lm.tokenizer.eos_token_id == hf.config.eos_token_id == 2
    assert hf_logits(hf, random_tokens(8, 0)).std() > 0.05  # logits spread past the tolerance


def test_logits_equal_hf_through_chunks_decodes_and_a_mixed_batch(family):
    _, _, lm, hf = family
    a, b = random_tokens(20, 1), random_tokens(9, 2)
    ref_a, ref_b = hf_logits(hf, a), hf_logits(hf, b)
    runner = PagedRunner(lm, seed=1)
    (a0,) = runner.step([("a", a[:7])])
    a1, b0 = runner.step([("a", a[7:13]), ("b", b[:5])])  # a prefill chunk beside a prompt
    _close(torch.cat([a0, a1]), ref_a[:13])
    _close(b0, ref_b[:5])
    for i in range(13, 17):  # two decodes in one forward
        da, db = runner.step([("a", [a[i]]), ("b", [b[i - 8]])])
        _close(da[0], ref_a[i])
        _close(db[0], ref_b[i - 8])
    (rest,) = runner.step([("a", a[17:])])
    _close(rest, ref_a[17:])


def test_32_greedy_tokens_equal_hf(family):
    _, _, lm, hf = family
    prompt = lm.tokenizer.encode("The paged cache")
    assert PagedRunner(lm, seed=3).greedy("g", prompt, 32) == hf_greedy(hf, prompt, 32)


def test_weight_specs_match_the_checkpoint(family):
    """A preset of this shape would generate exactly an HF checkpoint's tensors."""
    _, path, lm, _ = family
    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert {s.name: s.shape for s in lm.model.weight_specs()} == saved


# -- the sliding window ------------------------------------------------------------------


def test_mistral_is_served_up_to_its_window_and_refuses_more_naming_it(checkpoint, tmp_path):
    path = str(checkpoint("mistral"))
    with pytest.raises(ConfigError, match=f"exceeds the {WINDOW}-token sliding window"):
        load_model(ModelConfig(model=path, device="cpu", max_model_len=WINDOW + 1))
    assert load_model(ModelConfig(model=path, device="cpu", max_model_len=32)).max_model_len == 32
    profile = tmp_path / "profile.json"
    CostModel(name="fixed-test").save(profile)
    with LLM(path, block_size=4, num_gpu_blocks=32, num_host_blocks=4, profile=str(profile)) as llm:
        with pytest.raises(PromptTooLongError, match=f"sliding window.*{WINDOW}-token window"):
            llm.engine.add_request([3] * WINDOW)
        prompt = random_tokens(40, 5)
        out = llm.generate(prompt, SamplingParams(max_tokens=100, ignore_eos=True))[0]
    # stops at the window, every token HF's (whose window never binds within it)
    assert out.finish_reason == "length" and len(out.token_ids) == WINDOW - len(prompt)
    assert out.token_ids == hf_greedy(load_hf_model(path), prompt, WINDOW - len(prompt))


def _config(path: Path, **changes: object) -> dict:
    return {**json.loads((path / "config.json").read_text()), **changes}


def test_when_a_window_binds(checkpoint):
    mistral, qwen = checkpoint("mistral"), checkpoint("qwen2")
    for window, context in ((None, 128), (WINDOW, WINDOW), (500, 128)):
        arch = arch_from_hf_config(_config(mistral, sliding_window=window))
        assert (arch.sliding_window, arch.max_context) == (window, context)
    no_key = _config(mistral)
    del no_key["sliding_window"]
    assert arch_from_hf_config(no_key).sliding_window == 4096  # MistralConfig's default
    # Qwen slides only with use_sliding_window, in the layers from max_window_layers on
    for use, first, types, window in (
        (False, 0, None, None),
        (True, 2, None, None),  # 2 layers: none slides
        (True, 1, None, 32),
        (True, 9, ["full_attention", "sliding_attention"], 32),
    ):
        cfg = _config(qwen, use_sliding_window=use, max_window_layers=first, sliding_window=32)
        cfg["layer_types"] = types
        assert arch_from_hf_config(cfg).sliding_window == window


def test_an_unsupported_model_type_is_named_with_the_supported_ones(checkpoint):
    cfg = _config(checkpoint("qwen2"), model_type="gemma2")
    with pytest.raises(ModelLoadError, match="'gemma2'.*opt, llama, mistral, qwen2, qwen3"):
        arch_from_hf_config(cfg)


def test_family_and_llama3_presets():
    mistral = get_preset("tiny-mistral").arch
    assert mistral.max_context == mistral.sliding_window == 512
    assert load_model(ModelConfig(model="tiny-mistral", device="cpu")).max_model_len == 512
    qwen3 = get_preset("tiny-qwen3").arch
    assert qwen3.qk_norm and qwen3.q_size != qwen3.hidden_size
    assert get_preset("tiny-qwen2").arch.qkv_bias
    big = get_preset("llama3.1-8b").arch
    assert (big.num_layers, big.hidden_size, big.intermediate_size) == (32, 4096, 14336)
    assert big.kv_bytes_per_token("bfloat16") == 2 * 32 * 8 * 128 * 2
    assert get_preset("llama3.2-3b").arch.tie_word_embeddings
    assert get_preset("llama3.2-1b").arch == get_preset("llama-1b").arch
