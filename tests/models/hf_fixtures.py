"""Tiny HuggingFace checkpoints written to a directory, for equivalence tests.

`make_checkpoint(path, model_type, **overrides)` (model_type opt, llama, mistral,
qwen2 or qwen3; `make_opt_checkpoint` and `make_llama_checkpoint` name two) saves a
randomly initialised transformers model (safetensors by default) with a byte-level
`tokenizer.json` and a tokenizer_config.json, and returns the directory; `overrides`
go into the transformers config (e.g. `tie_word_embeddings=True`,
`num_key_value_heads=1`). `load_hf_model(path)` loads it back in transformers (fp32,
eager attention), the reference to compare fsd against; `PagedRunner` drives fsd's
model through a paged KV cache the way the engine does.

Weights are drawn wider than transformers' own init (std 0.02, zero biases, unit
norms) so that logits spread out and a wrong bias or norm mapping cannot hide.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from fsd.config import ModelConfig
from fsd.engine.stage import build_stage, stage_spans, stage_weights
from fsd.layers.attention import AttentionMetadata
from fsd.layers.parallel_state import get_tp_world_size
from fsd.models.base import CausalLM
from fsd.models.loader import LoadedModel, describe_model, param_defaults

TINY_VOCAB = 300  # > the tokenizer's 259 ids, as real checkpoints pad their vocabularies

OPT_BASE: dict[str, Any] = {
    "vocab_size": TINY_VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "ffn_dim": 128,
    "max_position_embeddings": 64,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "pad_token_id": 1,
    "bos_token_id": 2,
    "eos_token_id": 2,
}

LLAMA_BASE: dict[str, Any] = {
    "vocab_size": TINY_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

OPT_SPECIALS = ("<s>", "<pad>", "</s>")  # OPT: pad 1, bos = eos = "</s>" 2
LLAMA_SPECIALS = ("<pad>", "<s>", "</s>")  # Llama: bos 1, eos 2
MISTRAL_SPECIALS = ("<unk>", "<s>", "</s>")  # Mistral: bos 1, eos 2, no pad
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # no bos added; eos 2

MISTRAL_BASE: dict[str, Any] = {**LLAMA_BASE, "pad_token_id": None, "sliding_window": None}
QWEN2_BASE: dict[str, Any] = {**LLAMA_BASE, "pad_token_id": 0, "bos_token_id": 0}
QWEN3_BASE: dict[str, Any] = {**QWEN2_BASE, "head_dim": 24}  # != hidden / heads (16)


# model_type: (config class, model class, config, specials, bos the tokenizer prepends,
#              tokenizer_config.json's bos / eos / pad tokens)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], tuple[str, ...], str | None, tuple]] = {
    "opt": ("OPTConfig", "OPTForCausalLM", OPT_BASE, OPT_SPECIALS, "</s>", ("</s>", "</s>", "<pad>")),
    "llama": ("LlamaConfig", "LlamaForCausalLM", LLAMA_BASE, LLAMA_SPECIALS, "<s>", ("<s>", "</s>", "<pad>")),
    "mistral": ("MistralConfig", "MistralForCausalLM", MISTRAL_BASE, MISTRAL_SPECIALS, "<s>", ("<s>", "</s>", None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", QWEN2_BASE, QWEN_SPECIALS, None, (None, "<|im_end|>", "<|endoftext|>")),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", QWEN3_BASE, QWEN_SPECIALS, None, (None, "<|im_end|>", "<|endoftext|>")),
}  # fmt: skip


def make_checkpoint(
    path: str | Path,
    model_type: str,
    *,
    seed: int = 0,
    safe_serialization: bool = True,
    max_shard_size: str | None = None,
    chat_template: str | None = None,
    **overrides: Any,
) -> Path:
    """A tiny random checkpoint directory (config, weights, tokenizer) of that model type.

    safe_serialization=False writes pytorch_model.bin instead of model.safetensors;
    max_shard_size (e.g. "40KB") writes sharded safetensors with an index file;
    chat_template goes into tokenizer_config.json.
    """
    import transformers

    config_cls, model_cls, base, specials, bos, tokens = FAMILIES[model_type]
    config = getattr(transformers, config_cls)(**{**base, **overrides})
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    _spread_weights(model, seed)
    if safe_serialization:
        kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
        model.save_pretrained(str(path), **kwargs)
    else:  # transformers 5 only writes safetensors: save the .bin by hand, config via HF
        model.config.save_pretrained(str(path))
        torch.save(model.state_dict(), path / "pytorch_model.bin")
    make_tokenizer_json(path, specials, bos)
    tok_cfg = dict(zip(("bos_token", "eos_token", "pad_token"), tokens, strict=True))
    if chat_template is not None:
        tok_cfg["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return path


def make_opt_checkpoint(path: str | Path, **kwargs: Any) -> Path:
    """A tiny random OPT checkpoint directory (see make_checkpoint)."""
    return make_checkpoint(path, "opt", **kwargs)


def make_llama_checkpoint(path: str | Path, **kwargs: Any) -> Path:
    """A tiny random Llama checkpoint directory (GQA 4/2 heads unless overridden)."""
    return make_checkpoint(path, "llama", **kwargs)


def load_hf_model(path: str | Path) -> Any:
    """The transformers model saved at `path`, fp32, eager attention, eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def hf_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] float32 logits of one unpadded sequence."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def make_tokenizer_json(path: str | Path, specials: tuple[str, ...], bos: str | None) -> Path:
    """A byte-level tokenizer.json: specials first, then the 256 byte symbols, no merges.

    With `bos`, the post-processor prepends that token, as Llama's and OPT's do.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(specials)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    out = Path(path) / "tokenizer.json"
    tok.save(str(out))
    return out


def _spread_weights(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() >= 2:
                p.copy_(noise * 0.1)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:  # biases
                p.copy_(0.1 * noise)


# -- driving fsd's model ---------------------------------------------------------------

ATOL = 1e-4
RTOL = 1e-4
BLOCK_SIZE = 4


def random_tokens(n: int, seed: int, vocab: int = 259) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def assert_logits_close(
    ours: torch.Tensor, ref: torch.Tensor, atol: float = ATOL, rtol: float = RTOL
) -> None:
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=atol, rtol=rtol)


def pipeline_stages(path: str | Path, pp: int) -> list[CausalLM]:
    """The checkpoint's model as `pp` pipeline stages (fp32, CPU), built and loaded as a
    pipeline worker does (this process's tensor-parallel shard of each)."""
    info = describe_model(ModelConfig(model=str(path), device="cpu", dtype="float32"))
    stages = []
    for span in stage_spans(info.arch.num_layers, pp):
        with param_defaults(info.dtype, info.device):
            stage = build_stage(info.arch, span, "auto")
        stage.load_weights(stage_weights(info.weights(0, keep=span.holds), span))
        stages.append(stage.eval())
    return stages


class PagedRunner:
    """Drives a loaded model through a paged KV cache, the way the engine does.

    `stages`: run these pipeline stages in turn (pipeline_stages) instead of lm.model.
    `device`, `fill`: where the cache lives and what its free slots hold (NaN shows a
    read past a sequence's context).
    """

    def __init__(
        self,
        lm: LoadedModel,
        num_blocks: int = 64,
        seed: int = 0,
        stages: list[CausalLM] | None = None,
        device: str = "cpu",
        fill: float = 0.0,
    ) -> None:
        self.lm = lm
        self.device = device
        self.stages = stages or [lm.model]
        a = lm.arch
        kv_heads = a.kv_heads_per_rank(get_tp_world_size())
        shape = (num_blocks, BLOCK_SIZE, kv_heads, a.head_dim)
        self.caches = [
            [
                (
                    torch.full(shape, fill, dtype=lm.dtype, device=device),
                    torch.full(shape, fill, dtype=lm.dtype, device=device),
                )
                for _ in stage.decoder_layers()
            ]
            for stage in self.stages
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
        meta = AttentionMetadata.build(
            query_lens, context_lens, tables, BLOCK_SIZE, device=self.device
        )
        ids_t = torch.tensor(ids, device=self.device)
        pos_t, last = torch.tensor(positions, device=self.device), len(self.stages) - 1
        hidden = None
        with torch.inference_mode():
            for i, (stage, caches) in enumerate(zip(self.stages, self.caches, strict=True)):
                hidden = stage.forward_stage(
                    ids_t, pos_t, hidden, caches, meta, first=i == 0, last=i == last
                )
            assert hidden is not None and hidden.shape == (len(ids), self.lm.arch.hidden_size)
            logits = self.stages[-1].compute_logits(hidden)
        assert logits.dtype == torch.float32 or self.lm.dtype != torch.float32
        return list(logits.float().split(query_lens))

    def greedy(self, seq: str, prompt: list[int], n: int) -> list[int]:
        """n greedy tokens after `prompt`, one decode step at a time."""
        (logits,) = self.step([(seq, prompt)])
        got = [int(logits[-1].argmax())]
        while len(got) < n:
            (logits,) = self.step([(seq, [got[-1]])])
            got.append(int(logits[-1].argmax()))
        return got


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """transformers' n greedy tokens after `prompt` (no stop at eos)."""
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    return out[0, len(prompt) :].tolist()
