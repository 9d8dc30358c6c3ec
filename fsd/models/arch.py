"""The shape of a model, independent of where its weights come from.

`ModelArch` is what the engine, the KV cache planner and the model classes read;
presets build one directly, checkpoints through `ModelArch.from_hf_config`, which
accepts the config.json of HuggingFace OPT and Llama models (transformers v4 and v5
spellings of the RoPE settings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fsd.errors import ModelLoadError
from fsd.layers.activation import SUPPORTED_ACTIVATIONS
from fsd.layers.rotary import SUPPORTED_ROPE_TYPES, rope_type_of

FAMILIES = ("opt", "llama")
_MISSING = object()
_DTYPE_NAMES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}


def dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    """'float16' / 'torch.float16' / torch.float16 -> torch.float16."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).removeprefix("torch.")
    if key not in _DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {name!r}; use float32, float16 or bfloat16")
    return _DTYPE_NAMES[key]


@dataclass(frozen=True)
class ModelArch:
    """A decoder-only transformer's shape and the flags that select its variant."""

    family: str  # "opt" | "llama"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position: int
    norm_eps: float
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # every stop id (Llama 3 lists several); [0] is eos
    pad_token_id: int | None = None
    attention_bias: bool = False  # q/k/v/o biases (always on for OPT unless enable_bias=False)
    mlp_bias: bool = False
    hidden_act: str = "silu"
    # OPT only
    word_embed_proj_dim: int | None = None  # None = hidden_size (no project_in/out)
    do_layer_norm_before: bool = True
    final_layer_norm: bool = True
    norm_elementwise_affine: bool = True
    # The dtype the checkpoint was saved in ("float16", ...), if it says.
    checkpoint_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ModelLoadError(
                f"unknown model family {self.family!r}; supported: {', '.join(FAMILIES)}"
            )
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "max_position"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelLoadError(f"model {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.family == "opt" and self.num_heads * self.head_dim != self.hidden_size:
            raise ModelLoadError(
                f"OPT hidden_size {self.hidden_size} is not num_heads {self.num_heads} x head_dim"
            )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ModelLoadError(
                f"unsupported activation {self.hidden_act!r}; supported: {', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        if self.family == "llama" and self.hidden_act != "silu":
            raise ModelLoadError(f"Llama models need hidden_act 'silu', got {self.hidden_act!r}")
        kind = rope_type_of(self.rope_scaling)
        if kind not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(
                f"unsupported rope scaling {kind!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if self.eos_token_id is not None and not self.eos_token_ids:
            object.__setattr__(self, "eos_token_ids", (self.eos_token_id,))

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_heads_per_rank(self, tp_size: int = 1) -> int:
        """KV heads each tensor-parallel rank caches (1 when kv heads are replicated)."""
        return max(1, self.num_kv_heads // tp_size)

    def kv_bytes_per_token(self, dtype: str | torch.dtype, tp_size: int = 1) -> int:
        """Bytes of K and V, all layers, one token, on one tensor-parallel rank."""
        elem = torch.empty((), dtype=dtype_from_name(dtype)).element_size()
        return 2 * self.num_layers * self.kv_heads_per_rank(tp_size) * self.head_dim * elem

    def replace(self, **changes: Any) -> ModelArch:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> ModelArch:
        """Read a HuggingFace config.json dict; ModelLoadError names a missing or bad key."""
        if not isinstance(cfg, Mapping):
            raise ModelLoadError(f"config.json must hold a JSON object, got {type(cfg).__name__}")
        model_type = cfg.get("model_type")
        if model_type is None:
            raise ModelLoadError(
                f"config.json has no 'model_type'; supported model types: {', '.join(FAMILIES)}"
            )
        if model_type == "opt":
            return _opt_from_hf(cfg)
        if model_type == "llama":
            return _llama_from_hf(cfg)
        raise ModelLoadError(
            f"unsupported model_type {model_type!r} in config.json; supported: {', '.join(FAMILIES)}"
        )


def _get(cfg: Mapping[str, Any], key: str, default: Any = _MISSING) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is _MISSING:
        raise ModelLoadError(
            f"config.json (model_type {cfg.get('model_type')!r}) is missing the key {key!r}"
        )
    return default


def _pos_int(cfg: Mapping[str, Any], key: str, default: Any = _MISSING) -> int:
    value = _get(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(f"config.json: {key!r} must be a positive integer, got {value!r}")
    return value


def _float(cfg: Mapping[str, Any], key: str, default: Any = _MISSING) -> float:
    value = _get(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ModelLoadError(f"config.json: {key!r} must be a positive number, got {value!r}")
    return float(value)


def _flag(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    value = _get(cfg, key, default)
    if not isinstance(value, bool):
        raise ModelLoadError(f"config.json: {key!r} must be true or false, got {value!r}")
    return value


def _token_ids(cfg: Mapping[str, Any], key: str, default: Any) -> tuple[int, ...]:
    value = cfg.get(key, default)
    if value is None:
        return ()
    values = value if isinstance(value, list | tuple) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ModelLoadError(
            f"config.json: {key!r} must be a token id or a list of ids, got {value!r}"
        )
    return tuple(values)


def _first(ids: tuple[int, ...]) -> int | None:
    return ids[0] if ids else None


def _checkpoint_dtype(cfg: Mapping[str, Any]) -> str | None:
    value = cfg.get("torch_dtype") or cfg.get("dtype")
    if not isinstance(value, str):
        return None
    try:
        dtype_from_name(value)
    except ValueError:
        return None
    return value.removeprefix("torch.")


def _opt_from_hf(cfg: Mapping[str, Any]) -> ModelArch:
    hidden = _pos_int(cfg, "hidden_size")
    heads = _pos_int(cfg, "num_attention_heads")
    if hidden % heads:
        raise ModelLoadError(
            f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads}"
        )
    proj = _pos_int(cfg, "word_embed_proj_dim", hidden)
    bias = _flag(cfg, "enable_bias", True)
    pre_norm = _flag(cfg, "do_layer_norm_before", True)
    eos = _token_ids(cfg, "eos_token_id", 2)
    return ModelArch(
        family="opt",
        vocab_size=_pos_int(cfg, "vocab_size"),
        hidden_size=hidden,
        num_layers=_pos_int(cfg, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=_pos_int(cfg, "ffn_dim"),
        max_position=_pos_int(cfg, "max_position_embeddings"),
        norm_eps=1e-5,  # nn.LayerNorm's default; OPT configs do not set it
        tie_word_embeddings=_flag(cfg, "tie_word_embeddings", True),
        bos_token_id=_first(_token_ids(cfg, "bos_token_id", 2)),
        eos_token_id=_first(eos),
        eos_token_ids=eos,
        pad_token_id=_first(_token_ids(cfg, "pad_token_id", 1)),
        attention_bias=bias,
        mlp_bias=bias,
        hidden_act=str(_get(cfg, "activation_function", "relu")),
        word_embed_proj_dim=proj,
        do_layer_norm_before=pre_norm,
        final_layer_norm=pre_norm and not _flag(cfg, "_remove_final_layer_norm", False),
        norm_elementwise_affine=_flag(cfg, "layer_norm_elementwise_affine", True),
        checkpoint_dtype=_checkpoint_dtype(cfg),
    )


def _llama_rope(cfg: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from v5 `rope_parameters` or v4 `rope_theta` + `rope_scaling`."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ModelLoadError(f"config.json: rope settings must be an object, got {params!r}")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise ModelLoadError(f"config.json: 'rope_theta' must be a positive number, got {theta!r}")
    kind = rope_type_of(params)
    if kind == "default":
        return float(theta), None
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"config.json: unsupported rope scaling {kind!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "type")}
    scaling["rope_type"] = kind
    needed = ["factor"]
    if kind == "llama3":
        scaling.setdefault(
            "original_max_position_embeddings", cfg.get("max_position_embeddings", 2048)
        )
        needed += ["low_freq_factor", "high_freq_factor"]
    for key in needed:
        if not isinstance(scaling.get(key), int | float):
            raise ModelLoadError(f"config.json: {kind} rope scaling is missing {key!r}")
    return float(theta), scaling


def _llama_from_hf(cfg: Mapping[str, Any]) -> ModelArch:
    hidden = _pos_int(cfg, "hidden_size")
    heads = _pos_int(cfg, "num_attention_heads")
    kv_heads = _pos_int(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ModelLoadError(
            f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    if "head_dim" not in cfg and hidden % heads:
        raise ModelLoadError(
            f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads}"
        )
    theta, scaling = _llama_rope(cfg)
    eos = _token_ids(cfg, "eos_token_id", 2)
    return ModelArch(
        family="llama",
        vocab_size=_pos_int(cfg, "vocab_size"),
        hidden_size=hidden,
        num_layers=_pos_int(cfg, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_pos_int(cfg, "head_dim", hidden // heads),
        intermediate_size=_pos_int(cfg, "intermediate_size"),
        max_position=_pos_int(cfg, "max_position_embeddings", 2048),
        norm_eps=_float(cfg, "rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=_flag(cfg, "tie_word_embeddings", False),
        bos_token_id=_first(_token_ids(cfg, "bos_token_id", 1)),
        eos_token_id=_first(eos),
        eos_token_ids=eos,
        pad_token_id=_first(_token_ids(cfg, "pad_token_id", None)),
        attention_bias=_flag(cfg, "attention_bias", False),
        mlp_bias=_flag(cfg, "mlp_bias", False),
        hidden_act=str(_get(cfg, "hidden_act", "silu")),
        checkpoint_dtype=_checkpoint_dtype(cfg),
    )
