"""A HuggingFace config.json -> `ModelArch`, for every model type fsd runs.

OPT has its own layers; Llama, Mistral, Qwen2 and Qwen3 share the Llama layers and
differ by flags (`qkv_bias`, `qk_norm`, `sliding_window`, default head_dim and
special ids), read here the way transformers reads each config class, including its
defaults for keys a config leaves out. Both transformers v4 and v5 spellings of the
RoPE settings are accepted. Every failure is a ModelLoadError naming the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fsd.errors import ModelLoadError
from fsd.layers.rotary import SUPPORTED_ROPE_TYPES, rope_type_of
from fsd.models.arch import ModelArch, dtype_from_name

_MISSING = object()


def arch_from_hf_config(cfg: Mapping[str, Any]) -> ModelArch:
    """Read a HuggingFace config.json dict; ModelLoadError names a missing or bad key."""
    if not isinstance(cfg, Mapping):
        raise ModelLoadError(f"config.json must hold a JSON object, got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    supported = ", ".join(MODEL_TYPES)
    if model_type is None:
        raise ModelLoadError(f"config.json has no 'model_type'; supported model types: {supported}")
    reader = _READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        raise ModelLoadError(
            f"unsupported model_type {model_type!r} in config.json; supported: {supported}"
        )
    return reader(cfg)


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


def _window(cfg: Mapping[str, Any], default: int | None) -> int | None:
    """`sliding_window`: null is none; a missing key is the config class's default."""
    if "sliding_window" not in cfg:
        return default
    return None if cfg["sliding_window"] is None else _pos_int(cfg, "sliding_window")


def _qwen_window(cfg: Mapping[str, Any]) -> int | None:
    """Qwen2/3 slide only with use_sliding_window, and only in the layers past
    max_window_layers (or those `layer_types` names "sliding_attention")."""
    if not _flag(cfg, "use_sliding_window", False):
        return None
    types = cfg.get("layer_types")
    if isinstance(types, list):
        sliding = "sliding_attention" in types
    else:
        first = _get(cfg, "max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int):
            raise ModelLoadError(
                f"config.json: 'max_window_layers' must be an integer, got {first!r}"
            )
        sliding = first < _pos_int(cfg, "num_hidden_layers")
    return _window(cfg, 4096) if sliding else None


# What each Llama-shaped model type changes: its flags read from the config, and the
# defaults transformers' config class has for head_dim (None: hidden / heads) and ids.
def _llama_flags(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "attention_bias": _flag(cfg, "attention_bias", False),
        "mlp_bias": _flag(cfg, "mlp_bias", False),
    }


def _qwen2_flags(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {"qkv_bias": True, "sliding_window": _qwen_window(cfg)}  # o_proj has no bias


def _qwen3_flags(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "attention_bias": _flag(cfg, "attention_bias", False),
        "qk_norm": True,
        "sliding_window": _qwen_window(cfg),
    }


def _mistral_flags(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {"sliding_window": _window(cfg, 4096)}


_LLAMA_LIKE: dict[
    str, tuple[Callable[[Mapping[str, Any]], dict[str, Any]], int | None, Any, Any]
] = {
    # model_type: (flags, default head_dim, default bos id, default eos id)
    "llama": (_llama_flags, None, 1, 2),
    "mistral": (_mistral_flags, None, 1, 2),
    "qwen2": (_qwen2_flags, None, None, None),
    "qwen3": (_qwen3_flags, 128, None, None),
}


def _llama_like_from_hf(cfg: Mapping[str, Any]) -> ModelArch:
    model_type = str(cfg["model_type"])
    flags, head_dim, bos, eos_default = _LLAMA_LIKE[model_type]
    hidden = _pos_int(cfg, "hidden_size")
    heads = _pos_int(cfg, "num_attention_heads")
    kv_heads = _pos_int(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ModelLoadError(
            f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    if cfg.get("head_dim") is None and head_dim is None and hidden % heads:
        raise ModelLoadError(
            f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads}"
        )
    theta, scaling = _llama_rope(cfg)
    eos = _token_ids(cfg, "eos_token_id", eos_default)
    return ModelArch(
        family="llama",
        model_type=model_type,
        vocab_size=_pos_int(cfg, "vocab_size"),
        hidden_size=hidden,
        num_layers=_pos_int(cfg, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_pos_int(cfg, "head_dim", head_dim or hidden // heads),
        intermediate_size=_pos_int(cfg, "intermediate_size"),
        max_position=_pos_int(cfg, "max_position_embeddings", 2048),
        norm_eps=_float(cfg, "rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=_flag(cfg, "tie_word_embeddings", False),
        bos_token_id=_first(_token_ids(cfg, "bos_token_id", bos)),
        eos_token_id=_first(eos),
        eos_token_ids=eos,
        pad_token_id=_first(_token_ids(cfg, "pad_token_id", None)),
        hidden_act=str(_get(cfg, "hidden_act", "silu")),
        checkpoint_dtype=_checkpoint_dtype(cfg),
        **flags(cfg),
    )


_READERS: dict[str, Callable[[Mapping[str, Any]], ModelArch]] = {
    "opt": _opt_from_hf,
    **dict.fromkeys(_LLAMA_LIKE, _llama_like_from_hf),
}
MODEL_TYPES = tuple(_READERS)  # the config.json model types fsd reads
