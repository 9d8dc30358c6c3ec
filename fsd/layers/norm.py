"""Normalisation layers, replicated on every rank: LayerNorm (OPT), RMSNorm (Llama) and
RMSNorm per attention head (the q/k norm of Qwen3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fsd import kernels
from fsd.kernels import reference
from fsd.layers.linear import default_weight_loader, set_weight_attrs


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension; affine parameters optional (OPT's flag)."""

    def __init__(
        self, hidden_size: int, eps: float = 1e-5, elementwise_affine: bool = True
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
            self.bias = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
            set_weight_attrs(self.weight, default_weight_loader)
            set_weight_attrs(self.bias, default_weight_loader)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, affine={self.weight is not None}"


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 and scaled in the input dtype (as HF Llama).

    On a GPU each call is one fused kernel (`fsd.kernels.rms_norm`), and `add_norm`
    fuses the residual add before it too; elsewhere the reference, which rounds the same.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        set_weight_attrs(self.weight, default_weight_loader)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dim() == 2:
            return kernels.rms_norm(x, self.weight, self.eps)[0]
        return reference.rms_norm_ref(x, self.weight, self.eps)[0]

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the norm of residual + x, residual + x): the residual stream's next value."""
        normed, total = (kernels.rms_norm if x.is_cuda else reference.rms_norm_ref)(
            x, self.weight, self.eps, residual
        )
        assert total is not None
        return normed, total

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"


class HeadRMSNorm(RMSNorm):
    """RMSNorm of each head of a flattened [T, heads * head_dim] tensor (Qwen3's q/k norm).

    One weight of head_dim for every head, so every tensor-parallel rank holds it whole
    whatever heads it owns.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = x.reshape(*x.shape[:-1], -1, self.hidden_size)
        return super().forward(heads).reshape(x.shape)
