"""Activations: ReLU / GELU for OPT's FFN and SiluAndMul for Llama's SwiGLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """x = [gate | up] along the last dim -> silu(gate) * up (half the width)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class ReLU(nn.Module):
    """max(x, 0)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x)


class GELU(nn.Module):
    """GELU, exact (`erf`) or the tanh approximation (HF's `gelu_new`)."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate=self.approximate)


_ACTIVATIONS = {
    "relu": ReLU,
    "gelu": GELU,
    "gelu_new": lambda: GELU("tanh"),
    "gelu_pytorch_tanh": lambda: GELU("tanh"),
    "silu": nn.SiLU,
}

SUPPORTED_ACTIVATIONS = tuple(_ACTIVATIONS)


def get_act_fn(name: str) -> nn.Module:
    """An activation module by its HuggingFace config name."""
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(
            f"unsupported activation {name!r}; supported: {', '.join(SUPPORTED_ACTIVATIONS)}"
        ) from None
