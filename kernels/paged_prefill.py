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
softmax in fp32 (log2 domain) and the causal mask applied per row (``device.attend``,
the walk the decode kernel runs too). Tiles are scheduled longest-first to even out
the tail. ``head_dim`` is padded to a power of two with masking.
"""

from __future__ import annotations

from typing import Any

import torch

from fsd.kernels import device
from fsd.kernels.launch import attention_args, attention_constants, attention_dims, next_pow2

tl: Any = None  # triton.language, bound on first use


def _prefill_kernel(
    Q, K_CACHE, V_CACHE, BLOCK_TABLES, CONTEXT_LENS, QUERY_START_LOC, OUT, scale_log2, num_q_tiles,
    stride_qt, stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd, stride_btb, stride_btn,
    stride_ot, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One tile of a sequence's queries (positions x grouped heads) over its cached keys."""
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
    heads = kv_head * GROUP + g
    mask = ((q_idx < q_len) & (g < GROUP))[:, None] & (offs_d < HEAD_DIM)[None, :]
    q_pos = ctx - q_len + q_idx  # absolute positions

    tok = (q_begin + q_idx).to(tl.int64)
    q = device.load_tile(Q, tok * stride_qt + heads * stride_qh, offs_d, stride_qd, mask, UPCAST)

    # Keys up to the tile's last valid query position; nothing for a tile past q_len.
    last = tl.minimum(first + BLOCK_Q, q_len)
    kv_end = tl.where(first < q_len, ctx - q_len + last, 0)

    table = BLOCK_TABLES + seq.to(tl.int64) * stride_btb
    k_base = K_CACHE + kv_head * stride_kh
    v_base = V_CACHE + kv_head * stride_vh
    acc, m_i, l_i = device.attend(
        q, q_pos, 0, kv_end, table, k_base, v_base, scale_log2,
        stride_btn, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs, stride_vd,
        BLOCK_M, HEAD_DIM, BLOCK_SIZE, BLOCK_D, BLOCK_N, UPCAST, DOT_PRECISION,
    )  # fmt: skip

    tl.store(
        OUT + tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
        device.normalised(acc, l_i).to(OUT.dtype.element_ty),
        mask=mask,
    )


_kernels = device.jit_loader(globals(), "_prefill_kernel")


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
    num_tokens, _, _, _, num_kv_heads = attention_dims(q, k_cache, v_cache)
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

    consts = attention_constants(q, k_cache, block_n)
    block_g, block_q = _query_tile(consts["GROUP"], block_m, max_query_len)
    num_q_tiles = -(-max_query_len // block_q)

    (kernel,) = _kernels()
    caches = (q, k_cache, v_cache, block_tables, context_lens)
    args = attention_args(caches, (query_start_loc, out), scale, num_q_tiles, strided=(out,))
    kernel[(num_q_tiles, num_seqs, num_kv_heads)](
        *args,
        **consts,
        BLOCK_G=block_g,
        BLOCK_Q=block_q,
        BLOCK_M=block_q * block_g,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def _query_tile(group: int, block_m: int, max_query_len: int) -> tuple[int, int]:
    """(grouped heads, query positions) per tile: about ``block_m`` rows, fewer positions
    for short chunks, and at least the 16 rows ``tl.dot`` needs."""
    block_g = next_pow2(group)
    block_q = max(1, next_pow2(max(16, block_m)) // block_g)
    block_q = min(block_q, max(1, next_pow2(max_query_len)))
    if block_q * block_g < 16:
        block_q = -(-16 // block_g)
    return block_g, block_q
