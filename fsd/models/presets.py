"""Named model shapes with seeded random weights and the byte-level tokenizer.

Presets need no files: the daemon starts on `tiny` out of the box, and the real
OPT / Llama shapes let benchmarks and the simulator's profiles use true sizes
(compute and KV bytes per token) without downloading anything. Every preset has the
byte tokenizer's vocabulary, so only the vocabulary differs from the model it names.
The `tiny-*` family presets run each Llama-family variant's code path on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsd.errors import ModelLoadError
from fsd.models.arch import ModelArch
from fsd.tokenizer import ByteTokenizer

BYTE_VOCAB = ByteTokenizer.VOCAB_SIZE
_BYTE_IDS = {
    "bos_token_id": ByteTokenizer.BOS,
    "eos_token_id": ByteTokenizer.EOS,
    "pad_token_id": ByteTokenizer.PAD,
}


@dataclass(frozen=True)
class Preset:
    """A named architecture and what it is for."""

    name: str
    arch: ModelArch
    description: str


def _opt(hidden: int, layers: int, heads: int, ffn: int, max_position: int = 2048) -> ModelArch:
    return ModelArch(
        family="opt",
        vocab_size=BYTE_VOCAB,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=ffn,
        max_position=max_position,
        norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
        hidden_act="relu",
        word_embed_proj_dim=hidden,
        **_BYTE_IDS,
    )


def _llama(
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    inter: int,
    max_position: int,
    **extra: object,
) -> ModelArch:
    return ModelArch(
        family="llama",
        vocab_size=BYTE_VOCAB,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        max_position=max_position,
        norm_eps=1e-5,
        **_BYTE_IDS,
        **extra,  # type: ignore[arg-type]
    )


def _llama3_rope(factor: float) -> dict[str, object]:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


def _llama3(
    hidden: int, layers: int, heads: int, inter: int, head_dim: int, factor: float, tied: bool
) -> ModelArch:
    """A Llama 3.x shape: 8 kv heads, RoPE theta 500000 with llama3 scaling, 128k positions."""
    return _llama(
        hidden,
        layers,
        heads,
        8,
        head_dim,
        inter,
        131072,
        rope_theta=500000.0,
        rope_scaling=_llama3_rope(factor),
        tie_word_embeddings=tied,
    )


_TINY = (256, 4, 8, 4, 32, 688, 2048)  # hidden, layers, heads, kv heads, head_dim, ffn, positions
_LLAMA32_1B = _llama3(2048, 16, 32, 8192, 64, 32.0, tied=True)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "tiny",
            _llama(*_TINY),
            "default: small Llama (GQA 8/4 heads, 4 layers) that decodes fast on a CPU",
        ),
        Preset(
            "tiny-llama3",
            _llama(
                *_TINY,
                rope_theta=500000.0,
                rope_scaling=_llama3_rope(8.0),
                tie_word_embeddings=True,
            ),
            "tiny with Llama 3 RoPE scaling and a tied head",
        ),
        Preset(
            "tiny-qwen2",
            _llama(*_TINY, model_type="qwen2", qkv_bias=True, rope_theta=1000000.0),
            "tiny as Qwen2 / 2.5 (q/k/v biases)",
        ),
        Preset(
            "tiny-qwen3",
            _llama(256, 4, 8, 4, 64, 688, 2048, model_type="qwen3", qk_norm=True),
            "tiny as Qwen3 (q/k norm per head, head_dim 64 != hidden / heads)",
        ),
        Preset(
            "tiny-mistral",
            _llama(*_TINY, model_type="mistral", sliding_window=512),
            "tiny as Mistral with a 512-token sliding window (the context fsd serves)",
        ),
        Preset(
            "tiny-opt",
            _opt(128, 2, 4, 512, max_position=1024),
            "small OPT (2 layers, hidden 128) for tests",
        ),
        Preset("opt-125m", _opt(768, 12, 12, 3072), "facebook/opt-125m shape"),
        Preset("opt-1.3b", _opt(2048, 24, 32, 8192), "facebook/opt-1.3b shape"),
        Preset("opt-6.7b", _opt(4096, 32, 32, 16384), "facebook/opt-6.7b shape"),
        Preset("opt-13b", _opt(5120, 40, 40, 20480), "facebook/opt-13b shape"),
        Preset(
            "llama-1b",
            _LLAMA32_1B,
            "meta-llama/Llama-3.2-1B shape (GQA 32/8, llama3 RoPE, tied head)",
        ),
        Preset("llama3.2-1b", _LLAMA32_1B, "meta-llama/Llama-3.2-1B shape (llama-1b's name)"),
        Preset(
            "llama3.2-3b",
            _llama3(3072, 28, 24, 8192, 128, 32.0, tied=True),
            "meta-llama/Llama-3.2-3B shape (GQA 24/8, llama3 RoPE, tied head)",
        ),
        Preset(
            "llama3.1-8b",
            _llama3(4096, 32, 32, 14336, 128, 8.0, tied=False),
            "meta-llama/Llama-3.1-8B shape (GQA 32/8, llama3 RoPE, untied head)",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset of that name; ModelLoadError lists the presets otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelLoadError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None
