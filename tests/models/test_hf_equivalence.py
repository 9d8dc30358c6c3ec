"""fsd's OPT and Llama equal HuggingFace transformers, through the paged KV cache.

Each variant is a tiny random HF checkpoint saved to disk and loaded by
`fsd.models.loader.load_model`. Logits must match HF's (fp32) for every prompt
position after a prefill, after chunked prefills, and for decode steps one token at
a time, with block size 4 and shuffled block tables; also for several sequences of
different lengths (decodes and prefills) in one forward. On two gloo ranks, every
family (OPT, Llama, Qwen2, Qwen3, Mistral; their single-device tests are in
test_families.py) equals HF with TP=2, whole and as two pipeline stages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from fsd.config import ModelConfig
from fsd.layers.parallel_state import reset_tp_group, set_tp_group
from fsd.models.loader import load_model
from tests.models.hf_fixtures import (
    PagedRunner,
    hf_greedy,
    hf_logits,
    load_hf_model,
    make_checkpoint,
    make_llama_checkpoint,
    make_opt_checkpoint,
    pipeline_stages,
)
from tests.models.hf_fixtures import assert_logits_close as _close
from tests.models.hf_fixtures import random_tokens as _tokens

VARIANTS = {
    "opt": ("opt", {}),
    "opt-postnorm-proj-untied": (
        "opt",
        {"do_layer_norm_before": False, "word_embed_proj_dim": 32, "tie_word_embeddings": False},
    ),
    "llama-gqa": ("llama", {}),
    "llama-tied-bias-headdim": (
        "llama",
        {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True, "head_dim": 24},
    ),
    "llama-linear-rope": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}},
    ),
    "llama-mqa-llama3-rope": (
        "llama",
        {
            "num_key_value_heads": 1,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    family, overrides = VARIANTS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    make = make_opt_checkpoint if family == "opt" else make_llama_checkpoint
    make(path, **overrides)
    lm = load_model(ModelConfig(model=str(path), device="cpu", dtype="auto"))
    return path, lm, load_hf_model(path)


def test_logits_are_not_trivial(variant):
    """Guards the tolerance: the reference logits must spread well beyond it."""
    _, _, hf = variant
    assert hf_logits(hf, _tokens(8, 0)).std() > 0.05


def test_prefill_then_decode(variant):
    _, lm, hf = variant
    assert lm.dtype == torch.float32
    prompt, cont = _tokens(11, 1), _tokens(6, 2)
    ref = hf_logits(hf, prompt + cont)
    runner = PagedRunner(lm)
    (prefill,) = runner.step([("a", prompt)])
    _close(prefill, ref[: len(prompt)])
    for i, tok in enumerate(cont):
        (step,) = runner.step([("a", [tok])])
        _close(step[0], ref[len(prompt) + i])


def test_greedy_tokens_match_hf_generate(variant):
    _, lm, hf = variant
    prompt = lm.tokenizer.encode("The paged cache")
    assert PagedRunner(lm, seed=3).greedy("g", prompt, 8) == hf_greedy(hf, prompt, 8)


def test_chunked_prefill(variant):
    _, lm, hf = variant
    ids = _tokens(14, 4)
    ref = hf_logits(hf, ids)
    runner = PagedRunner(lm, seed=1)
    (a,) = runner.step([("s", ids[:5])])
    (b,) = runner.step([("s", ids[5:11])])
    (c,) = runner.step([("s", ids[11:])])
    _close(torch.cat([a, b, c]), ref)


def test_mixed_batch_of_decodes_and_prefills(variant):
    _, lm, hf = variant
    seqs = {"x": _tokens(9, 5), "y": _tokens(6, 6), "z": _tokens(13, 7), "w": _tokens(3, 8)}
    refs = {k: hf_logits(hf, v) for k, v in seqs.items()}
    runner = PagedRunner(lm, seed=2)
    # Two prompts of different lengths in one forward.
    x0, y0 = runner.step([("x", seqs["x"][:7]), ("y", seqs["y"][:4])])
    _close(x0, refs["x"][:7])
    _close(y0, refs["y"][:4])
    # Two decodes first, then a new prompt and a prefill chunk of a running sequence.
    x1, y1, z0, w0 = runner.step(
        [("x", [seqs["x"][7]]), ("y", [seqs["y"][4]]), ("z", seqs["z"]), ("w", seqs["w"])]
    )
    _close(x1[0], refs["x"][7])
    _close(y1[0], refs["y"][4])
    _close(z0, refs["z"])
    _close(w0, refs["w"])
    x2, y2 = runner.step([("x", [seqs["x"][8]]), ("y", seqs["y"][5:])])
    _close(x2[0], refs["x"][8])
    _close(y2, refs["y"][5:])


def test_weight_specs_match_the_checkpoint(variant):
    """The tensors a random preset init generates are exactly an HF checkpoint's."""
    path, lm, _ = variant
    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    specs = {s.name: s.shape for s in lm.model.weight_specs()}
    assert specs == saved


def test_tokenizer_matches_checkpoint(variant):
    path, lm, hf = variant
    ids = lm.tokenizer.encode("héllo €")
    assert ids[0] == hf.config.bos_token_id
    assert lm.tokenizer.decode(ids) == "héllo €"
    assert lm.tokenizer.eos_token_id == hf.config.eos_token_id
    assert lm.arch.eos_token_id == hf.config.eos_token_id


# -- tensor parallelism: two CPU ranks over gloo equal HF, whole and as 2 stages ---------

TP_VARIANTS = {
    "opt": ("opt", {}),
    "llama-gqa": ("llama", {}),  # 2 kv heads: one per rank
    "llama-mqa-tied-bias": (  # 1 kv head: replicated on both ranks
        "llama",
        {"num_key_value_heads": 1, "tie_word_embeddings": True, "attention_bias": True},
    ),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),  # q/k/v biases split by heads
    "qwen3-mqa": ("qwen3", {"num_key_value_heads": 1}),  # per-head q/k norms on both ranks
    "mistral-window": ("mistral", {"sliding_window": 64}),
}


def _tp_worker(rank: int, init_file: str, cases: list[tuple[str, list[int], Any]]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    set_tp_group(rank, 2)
    try:
        for path, ids, ref in cases:
            lm = load_model(ModelConfig(model=path, device="cpu"))
            # TP=2, then TP=2 x PP=2 (each rank runs both stages of its shard in turn)
            for stages in (None, pipeline_stages(path, 2)):
                runner = PagedRunner(lm, seed=rank, stages=stages)  # layouts may differ
                (prefill,) = runner.step([("t", ids[:-3])])
                steps = [runner.step([("t", [tok])])[0] for tok in ids[-3:]]
                _close(torch.cat([prefill, *steps]), ref)
    finally:
        reset_tp_group()
        dist.destroy_process_group()


def test_tensor_parallel_two_ranks_whole_and_pipelined_match_hf(tmp_path):
    import torch.multiprocessing as mp

    cases = []
    for name, (family, overrides) in TP_VARIANTS.items():
        path = make_checkpoint(tmp_path / name, family, **overrides)
        ids = _tokens(12, 9)
        cases.append((str(path), ids, hf_logits(load_hf_model(path), ids)))
    mp.spawn(_tp_worker, args=(str(tmp_path / "dist-init"), cases), nprocs=2, join=True)
