"""The shape of a model, independent of where its weights come from.

`ModelArch` is what the engine, the KV cache planner and the model classes read;
presets build one directly, checkpoints through `arch_from_hf_config`
(fsd.models.hf_config), which reads the config.json of HuggingFace OPT, Llama,
Mistral, Qwen2 and Qwen3 models. A family is a set of layers (`opt`, `llama`); the
Llama-shaped model types are the `llama` family with flags (`qkv_bias`, `qk_norm`,
`sliding_window`) and keep their HF name in `model_type`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from fsd.errors import ModelLoadError
from fsd.layers.activation import SUPPORTED_ACTIVATIONS
from fsd.layers.rotary import SUPPORTED_ROPE_TYPES, rope_type_of

FAMILIES = ("opt", "llama")
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

    family: str  # "opt" | "llama" (the layers; Mistral and Qwen are "llama" with flags)
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
    # Llama family only
    qkv_bias: bool = False  # q/k/v biases without an o_proj bias (Qwen2)
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE (Qwen3)
    # Attention sees only the last `sliding_window` tokens (Mistral, some Qwen). fsd does
    # not slide: it serves such a model up to its window, where sliding changes nothing.
    sliding_window: int | None = None
    model_type: str = ""  # the HF model_type ("qwen2", ...); "" = the family's name
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
        if self.family == "opt" and (self.qkv_bias or self.qk_norm):
            raise ModelLoadError("qkv_bias and qk_norm are Llama-family flags, not OPT's")
        window = self.sliding_window
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, int) or window < 1
        ):
            raise ModelLoadError(f"model sliding_window must be a positive integer, got {window!r}")
        if self.eos_token_id is not None and not self.eos_token_ids:
            object.__setattr__(self, "eos_token_ids", (self.eos_token_id,))
        if not self.model_type:
            object.__setattr__(self, "model_type", self.family)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def max_context(self) -> int:
        """The longest sequence fsd serves: the positions, or the sliding window if shorter."""
        return min(self.max_position, self.sliding_window or self.max_position)

    def context_note(self, max_model_len: int) -> str:
        """Why the context is `max_model_len` tokens, when the sliding window set it."""
        if max_model_len != self.max_context or self.max_context == self.max_position:
            return ""
        return (
            f" (the {self.model_type} model's sliding window: fsd serves it up to its "
            f"{self.sliding_window}-token window, within which attention does not slide)"
        )

    def kv_heads_per_rank(self, tp_size: int = 1) -> int:
        """KV heads each tensor-parallel rank caches (1 when kv heads are replicated)."""
        return max(1, self.num_kv_heads // tp_size)

    def kv_bytes_per_token(self, dtype: str | torch.dtype, tp_size: int = 1) -> int:
        """Bytes of K and V, all layers, one token, on one tensor-parallel rank."""
        elem = torch.empty((), dtype=dtype_from_name(dtype)).element_size()
        return 2 * self.num_layers * self.kv_heads_per_rank(tp_size) * self.head_dim * elem

    def replace(self, **changes: Any) -> ModelArch:
        return dataclasses.replace(self, **changes)
