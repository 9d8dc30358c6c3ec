"""Pure-torch references for the paged KV-cache kernels.

They define what the Triton kernels must compute, and the CPU engine runs them in
production, so they are vectorised where that is cheap: decode gathers whole cache
blocks through the block table for the entire batch at once; prefill loops over
sequences (few per step) and hands each one to SDPA, with its built-in causal mask
for a whole prompt and an explicit mask shifted by the cached prefix otherwise. Scores
and softmax are in fp32; results come back in q's dtype.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``; token position
``p`` of sequence ``s`` lives at ``block_tables[s, p // block_size]``, offset
``p % block_size``. Query head ``h`` reads KV head ``h // (Hq // Hkv)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` [T, Hkv, D] into the paged caches at ``slot_mapping`` [T].

    A slot is ``block_id * block_size + offset``; tokens whose slot is negative are
    skipped. The caches are updated in place (non-contiguous views are fine).
    """
    if key.shape[0] == 0:
        return
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.int64)
    if bool((slots < 0).any()):
        keep = slots >= 0
        slots, key, value = slots[keep], key[keep], value[keep]
    block_size = k_cache.shape[1]
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    offsets = slots % block_size
    k_cache[blocks, offsets] = key.to(k_cache.dtype)
    v_cache[blocks, offsets] = value.to(v_cache.dtype)


def gather_context(cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The first ``num_tokens`` positions of one or more sequences, read through their tables.

    ``block_table`` is [nb] (one sequence) or [B, nb]; returns [num_tokens, Hkv, D] or
    [B, num_tokens, Hkv, D] (a copy, in the cache's dtype).
    """
    block_size = cache.shape[1]
    num_blocks = -(-num_tokens // block_size)
    table = block_table[..., :num_blocks].to(device=cache.device, dtype=torch.int64)
    blocks = cache[table]  # [..., nb, block_size, Hkv, D]
    flat = blocks.reshape(*table.shape[:-1], num_blocks * block_size, *cache.shape[2:])
    return flat[..., :num_tokens, :, :]


def paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence ([B, Hq, D]) attending to all its ``context_lens`` cached tokens.

    K/V are gathered into padded [B, max_ctx, Hkv, D] tensors and masked past each
    sequence's length (one batched SDPA call, fp32); returns [B, Hq, D] in q's dtype.
    """
    batch, num_heads, head_dim = q.shape
    if batch == 0:
        return torch.empty_like(q)
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    lens = context_lens.to(device=q.device, dtype=torch.int64)
    max_ctx = int(lens.max())
    k = gather_context(k_cache, block_tables, max_ctx).float()  # [B, N, Hkv, D]
    v = gather_context(v_cache, block_tables, max_ctx).float()
    valid = torch.arange(max_ctx, device=q.device)[None, :] < lens[:, None]  # [B, N]
    padding = ~valid
    if bool(padding.any()):
        # Slots past a sequence's end may hold anything, NaN included, and a masked
        # score is added to, not replaced: zero them so nothing leaks through.
        k[padding] = 0.0
        v[padding] = 0.0
    # The query heads sharing a KV head become SDPA's query rows: [B, Hkv, G, D].
    qg = q.float().view(batch, num_kv_heads, group, head_dim)
    out = F.scaled_dot_product_attention(
        qg,
        k.permute(0, 2, 1, 3),
        v.permute(0, 2, 1, 3),
        attn_mask=valid[:, None, None, :],
        scale=scale,
    )
    return out.reshape(batch, num_heads, head_dim).to(q.dtype)


def paged_prefill_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention for the new tokens of each sequence over its paged cache.

    Sequence ``s`` owns ``q[qsl[s]:qsl[s+1]]`` ([Tq, Hq, D] overall); its query ``i``
    sits at position ``context_len - q_len + i`` and sees keys at positions up to and
    including its own. Their K/V must already be in the cache. Returns [Tq, Hq, D].
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for s, ctx in enumerate(lens):
        begin, end = starts[s], starts[s + 1]
        q_len = end - begin
        if q_len == 0:
            continue
        k = gather_context(k_cache, block_tables[s], ctx).float()  # [C, Hkv, D]
        v = gather_context(v_cache, block_tables[s], ctx).float()
        # [Hkv, G, L, D] queries against K/V expanded (no copy) over the group.
        qs = q[begin:end].float().view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        shape = (num_kv_heads, group, ctx, head_dim)
        k = k.transpose(0, 1).unsqueeze(1).expand(shape)
        v = v.transpose(0, 1).unsqueeze(1).expand(shape)
        if q_len == ctx:  # a whole prompt: SDPA's own (top-left) causal mask is right
            o = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=scale)
        else:  # continuing a cached prefix: the diagonal is shifted by ctx - q_len
            q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
            mask = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]  # [L, C]
            o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)
        out[begin:end] = o.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim).to(q.dtype)
    return out
