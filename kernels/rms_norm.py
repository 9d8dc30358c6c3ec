"""Triton kernel: RMSNorm, with the residual add before it fused in.

Why: in a decode step a norm is seven small elementwise launches (cast, square, mean,
add, rsqrt, multiply, cast and scale) and the residual add one more, twice a layer;
each costs a launch and a read and write of the row. One program per row reads the
row (and the residual) once, writes the sum back as the new residual, and writes the
normalised row. Rounding follows the reference (`reference.rms_norm_ref`, HF
Llama's): the sum rounds to the input dtype, the norm runs in fp32 and rounds to the
input dtype before the weight scales it.
"""

from __future__ import annotations

from typing import Any

import torch

from fsd.kernels import device
from fsd.kernels.launch import next_pow2

tl: Any = None  # triton.language, bound on first use


def _rms_norm_kernel(
    X,
    RES,
    W,
    OUT,
    SUM,
    stride_x,
    stride_r,
    stride_o,
    stride_s,
    n_cols,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(RES + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(SUM.dtype.element_ty)
        tl.store(SUM + row * stride_s + cols, x, mask=mask)
    h = x.to(tl.float32)
    h = h * (1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps))
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    y = w * h.to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, y.to(OUT.dtype.element_ty), mask=mask)


_kernels = device.jit_loader(globals(), "_rms_norm_kernel")


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm of each row of ``x`` [T, H] (``residual + x`` first, when given).

    Returns (normalised rows, the sum ``residual + x`` or None), both in x's dtype.
    """
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(
            f"rms_norm takes x [T, H] and weight [H]; got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty_like(x)
    total = torch.empty_like(x) if residual is not None else None
    if x.shape[0] == 0:
        return out, total
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    (kernel,) = _kernels()
    res, summed = (residual, total) if residual is not None else (x, out)  # unread stand-ins
    block = next_pow2(x.shape[1])
    kernel[(x.shape[0],)](
        x, res, weight, out, summed,
        x.stride(0), res.stride(0), out.stride(0), summed.stride(0),
        x.shape[1], float(eps),
        HAS_RES=residual is not None, BLOCK=block,
        num_warps=max(1, min(16, block // 256)),
    )  # fmt: skip
    return out, total
