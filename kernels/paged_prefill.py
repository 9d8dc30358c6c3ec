"""Triton kernel: causal prefill attention over the paged KV cache.

The new tokens' K/V are already in the cache (``store_kv`` ran first), so a prefill
chunk (possibly continuing a sequence that has earlier tokens cached) reads every key
through the block table: sequence ``s``'s query ``i`` is at absolute position
``context_len - q_len + i`` and sees keys ``0 ..= position``.

Design (flash-attention style): one program per (query tile, sequence, KV head). The
tile's rows are ``BLOCK_Q`` consecutive query positions times the ``G = Hq / Hkv``
query heads that share the KV head (row ``r`` is position ``r // BLOCK_G``, head
``r % BLOCK_G``), so each K/V tile fetched through the block table serves the whole
group (GQA-aware) and both products are ``tl.dot`` on [BLOCK_M, ...] tiles. Keys are
walked in ``BLOCK_N`` tiles only up to the tile's last query position, with an online
softmax in fp32 (log2 domain) and the causal mask applied per row. Tiles are
scheduled longest-first to even out the tail. ``head_dim`` is padded to a power of
two with masking.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from fsd.kernels.launch import next_pow2

tl: Any = None  # triton.language, bound on first use

LOG2E = 1.4426950408889634


def _prefill_kernel(
    Q,
    K_CACHE,
    V_CACHE,
    BLOCK_TABLES,
    CONTEXT_LENS,
    QUERY_START_LOC,
    OUT,
    scale_log2,
    num_q_tiles,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_btb,
    stride_btn,
    stride_ot,
    stride_oh,
    stride_od,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    q_tile = num_q_tiles - 1 - tl.program_id(0)  # late (longest) tiles first
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_begin = tl.load(QUERY_START_LOC + seq)
    q_len = tl.load(QUERY_START_LOC + seq + 1) - q_begin
    ctx = tl.load(CONTEXT_LENS + seq)
    first = q_tile * BLOCK_Q  # first query index of this tile

    rows = tl.arange(0, BLOCK_M)
    q_idx = first + rows // BLOCK_G
    g = rows % BLOCK_G
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + g
    row_mask = (q_idx < q_len) & (g < GROUP)
    d_mask = offs_d < HEAD_DIM
    q_pos = ctx - q_len + q_idx  # absolute positions

    tok = (q_begin + q_idx).to(tl.int64)
    q = tl.load(
        Q + tok[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)

    # Keys up to the tile's last valid query position; nothing for a tile past q_len.
    last = tl.minimum(first + BLOCK_Q, q_len)
    kv_end = tl.where(first < q_len, ctx - q_len + last, 0)

    table = BLOCK_TABLES + seq.to(tl.int64) * stride_btb
    k_base = K_CACHE + kv_head * stride_kh
    v_base = V_CACHE + kv_head * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tile in range(0, kv_end, BLOCK_N):
        pos = tile + offs_n
        n_mask = pos < kv_end
        block = tl.load(table + (pos // BLOCK_SIZE) * stride_btn, mask=n_mask, other=0)
        block = block.to(tl.int64)
        # No padded columns: a per-row mask lets loads vectorise. (A constexpr `if`, not a
        # ternary, so only one branch is ever compiled.)
        if HEAD_DIM == BLOCK_D:  # noqa: SIM108
            kv_mask = n_mask[:, None]
        else:
            kv_mask = n_mask[:, None] & d_mask[None, :]
        krow = block * stride_kb + (pos % BLOCK_SIZE) * stride_ks
        k = tl.load(k_base + krow[:, None] + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [M, N]
        # Key 0 is visible to every row, so the first tile leaves m_i finite.
        visible = (pos[None, :] <= q_pos[:, None]) & n_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        vrow = block * stride_vb + (pos % BLOCK_SIZE) * stride_vs
        v = tl.load(v_base + vrow[:, None] + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(
        OUT + tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
        out.to(OUT.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )


@functools.cache
def _kernel() -> Any:
    global tl
    import triton
    import triton.language as language

    tl = language
    return triton.jit(_prefill_kernel)


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    block_m: int = 64,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged cache.

    q [Tq, Hq, D]; sequence ``s`` owns ``q[qsl[s]:qsl[s+1]]`` and its query ``i`` is at
    position ``context_lens[s] - q_len_s + i``. Caches [num_blocks, block_size, Hkv, D],
    block_tables [S, max_blocks] int32, context_lens [S] int32, query_start_loc [S+1]
    int32. Returns [Tq, Hq, D] in q's dtype.

    ``max_query_len`` sizes the grid; when omitted it is read from ``query_start_loc``
    (one device sync). ``block_m`` (rows = query positions x grouped heads per
    program), ``block_n`` (keys per tile), ``num_warps`` and ``num_stages`` are tuning
    knobs.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches {tuple(k_cache.shape)} do not match q {tuple(q.shape)}")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not group onto {num_kv_heads} KV heads")
    num_seqs = context_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1 or block_tables.shape[0] < num_seqs:
        raise ValueError("query_start_loc must have S + 1 entries and block_tables S rows")
    out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len <= 0:
        return out

    group = num_heads // num_kv_heads
    block_g = next_pow2(group)
    block_d = max(16, next_pow2(head_dim))
    block_q = max(1, next_pow2(max(16, block_m)) // block_g)
    block_q = min(block_q, max(1, next_pow2(max_query_len)))  # short chunks: smaller tiles
    if block_q * block_g < 16:
        block_q = -(-16 // block_g)  # tl.dot needs at least 16 rows
    if block_n is None:
        block_n = 64 if block_d <= 128 else 32
    num_q_tiles = -(-max_query_len // block_q)
    upcast = q.device.type != "cuda"  # the interpreter's tl.dot mis-multiplies bf16
    precision = "ieee" if q.dtype == torch.float32 else "tf32"

    _kernel()[(num_q_tiles, num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        query_start_loc,
        out,
        float(scale) * LOG2E,
        num_q_tiles,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        HEAD_DIM=head_dim,
        GROUP=group,
        BLOCK_SIZE=block_size,
        BLOCK_G=block_g,
        BLOCK_Q=block_q,
        BLOCK_M=block_q * block_g,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        UPCAST=upcast,
        DOT_PRECISION=precision,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
