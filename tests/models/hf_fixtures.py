"""Tiny HuggingFace checkpoints written to a directory, for equivalence tests.

`make_opt_checkpoint(path, **overrides)` and `make_llama_checkpoint(path, **overrides)`
save a randomly initialised transformers model (safetensors by default) with a
byte-level `tokenizer.json` and return the directory; `overrides` go into the
transformers config (e.g. `tie_word_embeddings=True`, `num_key_value_heads=1`).
`load_hf_model(path)` loads it back in transformers (fp32, eager attention), the
reference to compare fsd against.

Weights are drawn wider than transformers' own init (std 0.02, zero biases, unit
norms) so that logits spread out and a wrong bias or norm mapping cannot hide.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

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


def make_opt_checkpoint(
    path: str | Path,
    *,
    seed: int = 0,
    safe_serialization: bool = True,
    max_shard_size: str | None = None,
    **overrides: Any,
) -> Path:
    """A tiny random OPT checkpoint directory (config, weights, tokenizer).

    safe_serialization=False writes pytorch_model.bin instead of model.safetensors;
    max_shard_size (e.g. "40KB") writes sharded safetensors with an index file.
    """
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(**{**OPT_BASE, **overrides})
    return _save(
        path, OPTForCausalLM, config, OPT_SPECIALS, "</s>", seed, safe_serialization, max_shard_size
    )


def make_llama_checkpoint(
    path: str | Path,
    *,
    seed: int = 0,
    safe_serialization: bool = True,
    max_shard_size: str | None = None,
    **overrides: Any,
) -> Path:
    """A tiny random Llama checkpoint directory (GQA 4/2 heads unless overridden)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**LLAMA_BASE, **overrides})
    return _save(
        path,
        LlamaForCausalLM,
        config,
        LLAMA_SPECIALS,
        "<s>",
        seed,
        safe_serialization,
        max_shard_size,
    )


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


def _save(
    path: str | Path,
    model_cls: Any,
    config: Any,
    specials: tuple[str, ...],
    bos: str,
    seed: int,
    safe_serialization: bool,
    max_shard_size: str | None,
) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    _spread_weights(model, seed)
    if safe_serialization:
        kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
        model.save_pretrained(str(path), **kwargs)
    else:  # transformers 5 only writes safetensors: save the .bin by hand, config via HF
        model.config.save_pretrained(str(path))
        torch.save(model.state_dict(), path / "pytorch_model.bin")
    make_tokenizer_json(path, specials, bos)
    eos = specials[2]
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": bos, "eos_token": eos, "pad_token": specials[1]})
    )
    return path


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
