"""Rotary position embedding (RoPE), neox style as in HF Llama.

The head dimension is split in two halves that rotate together
(`rotate_half`), not interleaved pairs. cos/sin for every position up to
`max_position` are computed once in float32 (same arithmetic as HF, so fp32
results match bit for bit) and gathered by position each step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_type_of(scaling: Mapping[str, Any] | None) -> str:
    """The scaling kind of an HF `rope_scaling` / `rope_parameters` dict."""
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def compute_inv_freq(
    head_dim: int, base: float, scaling: Mapping[str, Any] | None = None
) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] in float32, with optional scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32)
    inv_freq = 1.0 / (base ** (exponents / head_dim))
    kind = rope_type_of(scaling)
    if kind == "default":
        return inv_freq
    assert scaling is not None
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(
        f"unsupported rope scaling {kind!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths slowed by `factor`, a smooth band between."""
    factor = float(scaling["factor"])
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to flattened q [T, heads * d] and k [T, kv_heads * d] by position."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float = 10000.0,
        scaling: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        self.max_position = max_position
        self.base = base
        inv_freq = compute_inv_freq(head_dim, base, scaling)
        positions = torch.arange(max_position, dtype=torch.float32, device="cpu")
        freqs = positions[:, None] * inv_freq[None, :]
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # [max_position, head_dim]
        # Not persistent: it is derived from the config, never read from a checkpoint.
        self.register_buffer(
            "cos_sin_cache", cache.to(torch.get_default_device()), persistent=False
        )

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        cos = torch.cat((cos, cos), dim=-1).to(q.dtype).unsqueeze(1)  # [T, 1, d]
        sin = torch.cat((sin, sin), dim=-1).to(q.dtype).unsqueeze(1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(shape[0], -1, self.head_dim)
        return (x * cos + rotate_half(x) * sin).reshape(shape)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_position={self.max_position}, base={self.base}"
