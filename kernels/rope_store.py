"""Triton kernel: rotary position embedding of q and k, fused with storing k and v.

Why: RoPE in torch is about ten elementwise launches a layer (gather cos/sin, halves,
negate, concatenate, two multiplies and an add, for q and for k), and storing K/V one
more; each reads and writes its tensor again. One program per token reads its q, k
and v heads once, rotates q (written to a new tensor) and k, and writes k and v into
their cache slots. Rotation is neox style (halves, as HF Llama): with ``c, s`` the
position's cos and sin (from the fp32 cache, rounded to q's dtype), ``x1' = x1 c - x2 s``
and ``x2' = x2 c + x1 s``, each product and the sum rounded to the dtype as torch's
elementwise ops round them (`reference.rope_store_ref`).
"""

from __future__ import annotations

from typing import Any

import torch

from fsd.kernels import device
from fsd.kernels.launch import next_pow2

tl: Any = None  # triton.language, bound on first use


def _rope_store_kernel(
    Q, K, V, POS, COS_SIN, Q_OUT, K_CACHE, V_CACHE, SLOTS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_cs, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    num_heads, num_kv_heads,
    HALF: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    """One token: its q heads rotated into Q_OUT, its k (rotated) and v into their slot."""
    tok = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    pos = tl.load(POS + tok)
    row = COS_SIN + pos * stride_cs
    dt = Q_OUT.dtype.element_ty
    c = tl.load(row + offs_d, mask=d_mask, other=0.0).to(dt).to(tl.float32)
    s = tl.load(row + HALF + offs_d, mask=d_mask, other=0.0).to(dt).to(tl.float32)

    q_mask = (offs_h < num_heads)[:, None] & d_mask[None, :]
    q_at = Q + tok * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :]
    q1, q2 = _rotate(q_at, HALF, c, s, q_mask, dt)
    out_at = Q_OUT + tok * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    _store_halves(out_at, q1, q2, HALF, q_mask)

    slot = tl.load(SLOTS + tok)
    if slot >= 0:  # a padding row writes no K/V
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        kv_mask = (offs_h < num_kv_heads)[:, None] & d_mask[None, :]
        k1, k2 = _rotate(K + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], HALF,
                         c, s, kv_mask, dt)  # fmt: skip
        kdst = K_CACHE + block * stride_kcb + offset * stride_kcs + offs_h[:, None] * stride_kch
        _store_halves(kdst + offs_d[None, :], k1, k2, HALF, kv_mask)
        vsrc = V + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
        vdst = V_CACHE + block * stride_vcb + offset * stride_vcs + offs_h[:, None] * stride_vch
        v1 = tl.load(vsrc, mask=kv_mask)
        v2 = tl.load(vsrc + HALF, mask=kv_mask)
        _store_halves(vdst + offs_d[None, :], v1, v2, HALF, kv_mask)


def _store_halves(at, x1, x2, HALF: tl.constexpr, mask):
    """Store the two halves of the heads at ``at`` (rows: heads), cast to its dtype."""
    tl.store(at, x1.to(at.dtype.element_ty), mask=mask)
    tl.store(at + HALF, x2.to(at.dtype.element_ty), mask=mask)


def _rotate(at, HALF: tl.constexpr, c, s, mask, dt: tl.constexpr):
    """The rotated halves of the heads at ``at`` (rows: heads), rounded as torch rounds."""
    x1 = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(at + HALF, mask=mask, other=0.0).to(tl.float32)
    x1c = (x1 * c[None, :]).to(dt).to(tl.float32)
    x2s = (x2 * s[None, :]).to(dt).to(tl.float32)
    x2c = (x2 * c[None, :]).to(dt).to(tl.float32)
    x1s = (x1 * s[None, :]).to(dt).to(tl.float32)
    return (x1c - x2s).to(dt), (x2c + x1s).to(dt)


_kernels = device.jit_loader(globals(), "_rope_store_kernel", helpers=("_rotate", "_store_halves"))


def rope_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] at ``positions`` [T] by ``cos_sin``
    [max_position, D] (cos then sin halves, fp32), store the rotated k and v [T, Hkv, D]
    in the caches [NB, BS, Hkv, D] at ``slot_mapping`` (a negative slot stores nothing).
    Returns the rotated q (a new tensor); k and v are left as they were."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if head_dim % 2 or k.shape != v.shape or k.shape[::2] != (num_tokens, head_dim):
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the caches' head_dim must be contiguous")
    if cos_sin.shape[1] != head_dim or positions.shape[0] < num_tokens:
        raise ValueError("cos_sin must be [max_position, head_dim] and positions cover the tokens")
    if min(t.stride(-1) for t in (q, k, v)) != 1 or cos_sin.stride(-1) != 1:
        q, k, v, cos_sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, cos_sin))
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    (kernel,) = _kernels()
    half = head_dim // 2
    kernel[(num_tokens,)](
        q, k, v, positions, cos_sin, out, k_cache, v_cache, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), cos_sin.stride(0),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        num_heads, num_kv_heads,
        HALF=half, BLOCK_SIZE=k_cache.shape[1], BLOCK_H=next_pow2(max(num_heads, num_kv_heads)),
        BLOCK_HALF=next_pow2(half), num_warps=4 if num_heads * half >= 1024 else 1,
    )  # fmt: skip
    return out
