"""Triton kernel: scatter this step's K/V into the paged cache by slot mapping.

Design: one program per (token, group of KV heads) copies a [heads, head_dim] tile of
K and of V to ``block = slot // block_size, offset = slot % block_size``. A negative
slot (a padding token) masks the whole store. Every tensor is addressed through its
own strides, so a cache that is a view into a bigger per-layer tensor works, and the
slot arithmetic is 64-bit so caches past 2**31 elements are fine.

Triton is imported (and the kernel JIT-wrapped) on first use, so importing this module
costs nothing when Triton is absent and ``TRITON_INTERPRET`` may be set late.
"""

from __future__ import annotations

from typing import Any

import torch

from fsd.kernels import device
from fsd.kernels.launch import next_pow2

tl: Any = None  # triton.language, bound on first use


def _store_kv_kernel(
    KEY,
    VALUE,
    K_CACHE,
    V_CACHE,
    SLOTS,
    num_kv_heads,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_kcd,
    stride_vcb,
    stride_vcs,
    stride_vch,
    stride_vcd,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    # The slot as a per-head vector: the interpreter cannot AND a scalar mask into a tile.
    slot = tl.zeros([BLOCK_H], dtype=tl.int64) + tl.load(SLOTS + tok).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    mask = ((slot >= 0) & (heads < num_kv_heads))[:, None] & (offs_d[None, :] < HEAD_DIM)
    tok64 = tok.to(tl.int64)

    # K, then V: the same copy, each through its own strides.
    _copy_heads(KEY + tok64 * stride_kt, stride_kh, stride_kd, heads, offs_d, mask,
                K_CACHE, block, offset, stride_kcb, stride_kcs, stride_kch, stride_kcd)  # fmt: skip
    _copy_heads(VALUE + tok64 * stride_vt, stride_vh, stride_vd, heads, offs_d, mask,
                V_CACHE, block, offset, stride_vcb, stride_vcs, stride_vch, stride_vcd)  # fmt: skip


def _copy_heads(
    src,
    stride_h,
    stride_d,
    heads,
    offs_d,
    mask,
    CACHE,
    block,
    offset,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_cd,
):
    """Copy the ``heads`` of one token (row ``src``) to its slot (``block``, ``offset``)
    in ``CACHE``, cast to the cache's dtype."""
    x = tl.load(src + heads[:, None] * stride_h + offs_d[None, :] * stride_d, mask=mask)
    dst = CACHE + block * stride_cb + offset * stride_cs + heads * stride_ch
    tl.store(dst[:, None] + offs_d[None, :] * stride_cd, x.to(CACHE.dtype.element_ty), mask=mask)


_kernels = device.jit_loader(globals(), "_store_kv_kernel", helpers=("_copy_heads",))


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` [T, Hkv, D] into ``k_cache``/``v_cache`` [NB, BS, Hkv, D].

    ``slot_mapping`` [T] (int64) holds ``block_id * block_size + offset`` per token; a
    negative slot skips that token. Values are cast to the cache dtype.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError("k_cache and v_cache must both be [num_blocks, block_size, Hkv, D]")
    if tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(f"cache {tuple(k_cache.shape)} does not hold heads {tuple(key.shape)}")
    if slot_mapping.shape[0] < num_tokens:
        raise ValueError("slot_mapping is shorter than the batch")
    if num_tokens == 0:
        return
    block_d = max(16, next_pow2(head_dim))
    block_h = min(next_pow2(num_kv_heads), max(1, 4096 // block_d))
    grid = (num_tokens, -(-num_kv_heads // block_h))
    (kernel,) = _kernels()
    kernel[grid](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        num_kv_heads,
        *key.stride(),
        *value.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        num_warps=4 if block_h * block_d >= 1024 else 1,
    )
