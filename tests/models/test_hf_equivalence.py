"""fsd's OPT and Llama equal HuggingFace transformers, through the paged KV cache.

Each variant is a tiny random HF checkpoint saved to disk and loaded by
`fsd.models.loader.load_model`. Logits must match HF's (fp32) for every prompt
position after a prefill, after chunked prefills, and for decode steps one token at
a time, with block size 4 and shuffled block tables; also for several sequences of
different lengths (decodes and prefills) in one forward.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from fsd.config import ModelConfig
from fsd.layers.attention import AttentionMetadata
from fsd.layers.parallel_state import get_tp_world_size, reset_tp_group, set_tp_group
from fsd.models.loader import LoadedModel, load_model
from tests.models.hf_fixtures import (
    hf_logits,
    load_hf_model,
    make_llama_checkpoint,
    make_opt_checkpoint,
)

ATOL = 1e-4
RTOL = 1e-4
BLOCK_SIZE = 4

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


class PagedRunner:
    """Drives a loaded model through a paged KV cache, the way the engine does."""

    def __init__(self, lm: LoadedModel, num_blocks: int = 64, seed: int = 0) -> None:
        self.lm = lm
        a = lm.arch
        kv_heads = a.kv_heads_per_rank(get_tp_world_size())
        shape = (num_blocks, BLOCK_SIZE, kv_heads, a.head_dim)
        self.caches = [
            (torch.zeros(shape, dtype=lm.dtype), torch.zeros(shape, dtype=lm.dtype))
            for _ in range(a.num_layers)
        ]
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}

    def step(self, batch: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """One forward over [(seq, new ids)] (decodes first); logits [len(ids), vocab] each."""
        query_lens, context_lens, tables, ids, positions = [], [], [], [], []
        for seq, new in batch:
            start = self.lens.get(seq, 0)
            end = start + len(new)
            table = self.tables.setdefault(seq, [])
            while len(table) * BLOCK_SIZE < end:
                table.append(self.free.pop())
            self.lens[seq] = end
            query_lens.append(len(new))
            context_lens.append(end)
            tables.append(list(table))
            ids += new
            positions += range(start, end)
        meta = AttentionMetadata.build(query_lens, context_lens, tables, BLOCK_SIZE)
        with torch.inference_mode():
            hidden = self.lm.model(torch.tensor(ids), torch.tensor(positions), self.caches, meta)
            assert hidden.shape == (len(ids), self.lm.arch.hidden_size)
            logits = self.lm.model.compute_logits(hidden)
        assert logits.dtype == torch.float32
        return list(logits.split(query_lens))


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    family, overrides = VARIANTS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    make = make_opt_checkpoint if family == "opt" else make_llama_checkpoint
    make(path, **overrides)
    lm = load_model(ModelConfig(model=str(path), device="cpu", dtype="auto"))
    return path, lm, load_hf_model(path)


def _tokens(n: int, seed: int, vocab: int = 259) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def _close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=RTOL)


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
    out = hf.generate(
        torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    expected = out[0, len(prompt) :].tolist()
    runner = PagedRunner(lm, seed=3)
    (logits,) = runner.step([("g", prompt)])
    got = [int(logits[-1].argmax())]
    while len(got) < len(expected):
        (logits,) = runner.step([("g", [got[-1]])])
        got.append(int(logits[-1].argmax()))
    assert got == expected


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


# -- tensor parallelism: two CPU ranks over gloo equal HF -------------------------------

TP_VARIANTS = {
    "opt": ("opt", {}),
    "llama-gqa": ("llama", {}),  # 2 kv heads: one per rank
    "llama-mqa-tied-bias": (  # 1 kv head: replicated on both ranks
        "llama",
        {"num_key_value_heads": 1, "tie_word_embeddings": True, "attention_bias": True},
    ),
}


def _tp_worker(rank: int, init_file: str, cases: list[tuple[str, list[int], Any]]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    set_tp_group(rank, 2)
    try:
        for path, ids, ref in cases:
            lm = load_model(ModelConfig(model=path, device="cpu"))
            runner = PagedRunner(lm, seed=rank)  # each rank's cache layout may differ
            (prefill,) = runner.step([("t", ids[:-3])])
            steps = [runner.step([("t", [tok])])[0] for tok in ids[-3:]]
            _close(torch.cat([prefill, *steps]), ref)
    finally:
        reset_tp_group()
        dist.destroy_process_group()


def test_tensor_parallel_two_ranks_match_hf(tmp_path):
    import torch.multiprocessing as mp

    cases = []
    for name, (family, overrides) in TP_VARIANTS.items():
        make = make_opt_checkpoint if family == "opt" else make_llama_checkpoint
        path = make(tmp_path / name, **overrides)
        ids = _tokens(12, 9)
        cases.append((str(path), ids, hf_logits(load_hf_model(path), ids)))
    mp.spawn(_tp_worker, args=(str(tmp_path / "dist-init"), cases), nprocs=2, join=True)
