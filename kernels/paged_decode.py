"""Triton kernel: paged decode attention, split-K ("flash-decoding").

Why split-K: a decode step has one query per sequence, so one program per (sequence,
KV head) gives only B * Hkv programs, often fewer than the GPU has SMs, each walking
thousands of keys alone. Decode is bound by reading K/V, so contexts are cut into
ranges run by (sequence, KV head, split) programs in parallel.

Why fixed chunks: every split covers the same ``chunk`` tokens of its sequence
(``split * chunk`` on), chosen on the host from the batch's longest context (or the
block table's bound on it). Cutting each sequence by its own length gave a short
sequence as many tiny splits as a long one, each paying a partial write and a merge,
while the long one's splits set the time of the batch; with fixed chunks a ragged
batch costs about its bytes. Programs past their sequence's end exit at once, and a
sequence that fits in one chunk is written directly and skipped by the merge.

Stage 1 (one program per (sequence, KV head, split)) walks its range in tiles of
``BLOCK_N`` tokens. Each token's cache block comes from the block table, one load per
distinct block of a tile (``device.attend``, which the prefill kernel runs too), so any
block size 1..128 is read the same way and a tile may span several blocks. It keeps an
online softmax (running max ``m``, running sum ``l`` in the log2 domain, fp32) and
writes the split's normalised output with its log-sum-exp ``lse = m + log2(l)``.

Stage 2 (one program per (sequence, query head)) merges the ``ceil(ctx / chunk)``
splits of a longer sequence: with ``M = max lse_i`` the result is
``sum_i 2**(lse_i - M) o_i / sum_i 2**(lse_i - M)``, exact and overflow-free. When no
sequence can need two chunks, stage 1 writes the output directly and there is no
stage 2.

Grouped heads: the ``Hq / Hkv`` query heads that share a KV head sit in one program as
the rows of a [BLOCK_G, D] tile (masked), so each K/V tile is read once for the whole
group. Why two ways to multiply: ``tl.dot`` needs at least 16 rows, so one head per
KV head (MHA) would pad each product 16-fold and stage its operands through shared
memory, while row by row on the CUDA cores it costs about as much and needs neither.
Each further row costs the CUDA cores that again but the padded ``tl.dot`` nothing, so
groups above ``launch.ROW_GROUP_MAX`` keep ``tl.dot`` (``use_dot`` picks either).
``head_dim`` is padded to a power of two with masking.
"""

from __future__ import annotations

from typing import Any

import torch

from fsd.kernels import device
from fsd.kernels.launch import (
    attention_args,
    attention_constants,
    attention_dims,
    decode_chunking,
    decode_group_tile,
    next_pow2,
    num_sms_of,
)

tl: Any = None  # triton.language, bound on first use


def _decode_split_kernel(
    Q, K_CACHE, V_CACHE, BLOCK_TABLES, CONTEXT_LENS, O_PART, LSE_PART, OUT, scale_log2, chunk,
    stride_qb, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd, stride_btb, stride_btn,
    stride_pb, stride_ph, stride_ps, stride_pd, stride_lb, stride_lh, stride_ls,
    stride_ob, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DIRECT: tl.constexpr, USE_DOT: tl.constexpr,
):  # fmt: skip
    """Stage 1: the GROUP query heads of one KV head over one split of a sequence's keys."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    ctx = tl.load(CONTEXT_LENS + seq)
    start = split * chunk
    if start < ctx:  # a program past its sequence's end has nothing to read or write
        end = tl.minimum(start + chunk, ctx)
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        heads = kv_head * GROUP + offs_g
        g_mask = offs_g < GROUP
        out_mask = g_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
        q = device.load_tile(Q + seq * stride_qb, heads * stride_qh, offs_d, stride_qd, out_mask,
                             UPCAST)  # fmt: skip

        table = BLOCK_TABLES + seq.to(tl.int64) * stride_btb
        k_base = K_CACHE + kv_head * stride_kh
        v_base = V_CACHE + kv_head * stride_vh
        acc, m_i, l_i = device.attend(
            q, None, start, end, table, k_base, v_base, scale_log2,
            stride_btn, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs, stride_vd,
            BLOCK_G, HEAD_DIM, BLOCK_SIZE, BLOCK_D, BLOCK_N, UPCAST, DOT_PRECISION, USE_DOT,
        )  # fmt: skip

        out = device.normalised(acc, l_i)
        if (ctx <= chunk) | DIRECT:  # its only chunk: the result itself
            tl.store(
                OUT + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
                out.to(OUT.dtype.element_ty),
                mask=out_mask,
            )
        else:
            lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.where(l_i > 0.0, l_i, 1.0)), float("-inf"))
            part = O_PART + seq * stride_pb + split * stride_ps
            tl.store(
                part + heads[:, None] * stride_ph + offs_d[None, :] * stride_pd, out, mask=out_mask
            )
            tl.store(
                LSE_PART + seq * stride_lb + heads * stride_lh + split * stride_ls, lse, mask=g_mask
            )


def _decode_merge_kernel(
    O_PART,
    LSE_PART,
    OUT,
    CONTEXT_LENS,
    chunk,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_pd,
    stride_lb,
    stride_lh,
    stride_ls,
    stride_ob,
    stride_oh,
    stride_od,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_splits = tl.cdiv(tl.load(CONTEXT_LENS + seq), chunk)
    if num_splits > 1:  # a sequence of one chunk was written by stage 1
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        s_mask = offs_s < num_splits
        d_mask = offs_d < HEAD_DIM
        lse = tl.load(
            LSE_PART + seq * stride_lb + head * stride_lh + offs_s * stride_ls,
            mask=s_mask,
            other=float("-inf"),
        )
        weight = tl.exp2(lse - tl.max(lse, axis=0))  # the first split is never empty
        part = tl.load(
            O_PART
            + seq * stride_pb
            + head * stride_ph
            + offs_s[:, None] * stride_ps
            + offs_d[None, :] * stride_pd,
            mask=s_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        out = tl.sum(part * weight[:, None], axis=0) / tl.sum(weight, axis=0)
        tl.store(
            OUT + seq * stride_ob + head * stride_oh + offs_d * stride_od,
            out.to(OUT.dtype.element_ty),
            mask=d_mask,
        )


_kernels = device.jit_loader(globals(), "_decode_split_kernel", "_decode_merge_kernel")


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    *,
    max_context: int | None = None,
    use_dot: bool | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Attention of one new query per sequence over its paged K/V cache.

    q [B, Hq, D] sits at position ``context_lens[b] - 1``; caches are
    [num_blocks, block_size, Hkv, D]; block_tables [B, max_blocks] int32;
    context_lens [B] int32 (>= 1). Returns [B, Hq, D] in q's dtype.

    ``max_context`` (at least every ``context_lens``; the host knows it from the step's
    metadata) sizes the chunk and the grid; without it the bound
    ``max_blocks * block_size`` does, so the call never syncs with the device.
    ``num_splits`` (how many chunks that context is cut into) overrides the heuristic
    (``launch.choose_chunk``); ``use_dot`` puts the products on ``tl.dot`` or off it
    (default: off for groups up to ``launch.ROW_GROUP_MAX``); ``block_n`` (keys per
    tile), ``num_warps`` and ``num_stages`` are tuning knobs.
    """
    batch, _, head_dim, block_size, num_kv_heads = attention_dims(q, k_cache, v_cache)
    if block_tables.shape[0] < batch or context_lens.shape[0] < batch:
        raise ValueError("block_tables / context_lens have fewer rows than q")
    out = torch.empty_like(q)
    if batch == 0:
        return out
    if max_context is None:
        max_context = block_tables.shape[1] * block_size  # a bound known without a device sync
    consts = attention_constants(q, k_cache, block_n)
    chunk, num_splits = decode_chunking(
        batch, num_kv_heads, max_context, consts["BLOCK_N"], num_sms_of(q.device), num_splits
    )
    consts["USE_DOT"], consts["BLOCK_G"] = decode_group_tile(consts["GROUP"], use_dot)
    consts["DIRECT"] = num_splits == 1  # no sequence needs two chunks: no merge at all

    split_kernel, merge_kernel = _kernels()
    o_part, lse_part = _partials(out, num_splits)
    parts = (o_part, lse_part, out)
    args = attention_args(
        (q, k_cache, v_cache, block_tables, context_lens), parts, scale, chunk, strided=parts
    )
    split_kernel[(batch, num_kv_heads, num_splits)](
        *args, **consts, num_warps=num_warps, num_stages=num_stages
    )
    if not consts["DIRECT"]:
        _merge(merge_kernel, (o_part, lse_part, out), context_lens, chunk, num_splits, head_dim,
               consts["BLOCK_D"])  # fmt: skip
    return out


def _partials(out: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's per-split outputs and log-sum-exps (fp32; 1-element stand-ins when direct)."""
    if num_splits == 1:
        return (
            out.new_empty((1, 1, 1, 1), dtype=torch.float32),
            out.new_empty((1, 1, 1), dtype=torch.float32),
        )
    batch, num_heads, head_dim = out.shape
    return (
        out.new_empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32),
        out.new_empty((batch, num_heads, num_splits), dtype=torch.float32),
    )


def _merge(
    merge_kernel: Any,
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    context_lens: torch.Tensor,
    chunk: int,
    num_splits: int,
    head_dim: int,
    block_d: int,
) -> None:
    """Stage 2: merge the splits into `out`, one program per (sequence, query head)."""
    o_part, lse_part, out = tensors
    batch, num_heads, _ = out.shape
    merge_kernel[(batch, num_heads)](
        o_part,
        lse_part,
        out,
        context_lens,
        chunk,
        *o_part.stride(),
        *lse_part.stride(),
        *out.stride(),
        HEAD_DIM=head_dim,
        BLOCK_S=max(2, next_pow2(num_splits)),
        BLOCK_D=block_d,
        num_warps=4 if block_d >= 128 else 2,
    )
