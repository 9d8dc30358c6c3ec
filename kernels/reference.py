"""Pure-torch references for the paged KV-cache kernels.

They define what the Triton kernels must compute, and the CPU engine runs them in
production, so they are vectorised where that is cheap: decode gathers the used cache
blocks of the entire batch at once, into scratch copies that every layer of a step
reuses (`DecodeGather`), and runs one masked SDPA call; prefill loops over
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
    # whole blocks, one contiguous copy each (faster than advanced indexing)
    blocks = cache.index_select(0, table.reshape(-1))
    flat = blocks.view(*table.shape[:-1], num_blocks * block_size, *cache.shape[2:])
    return flat[..., :num_tokens, :, :]


class DecodeGather:
    """What a decode batch reads from the cache, worked out once and shared by every layer.

    Each sequence reads the first ``num_blocks`` entries of its table, ``num_blocks``
    covering the longest context. Gathered positions past a sequence's context (the
    tail of its last block, or whole blocks of a shorter table) are ``pad_rows`` of the
    flat [B * num_blocks * block_size] token rows: they are zeroed after each read,
    since a free slot may hold anything, NaN included, and a masked score is added to,
    not replaced. ``valid`` [B, num_blocks * block_size] is the attention mask (None
    when nothing is padded). The K and V copies go to two scratch buffers that every
    layer of the step reuses, so a step allocates them once.
    """

    def __init__(
        self, block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int
    ) -> None:
        lens = context_lens.to(dtype=torch.int64)
        self.batch = int(lens.shape[0])
        max_ctx = int(lens.max()) if self.batch else 0
        self.num_blocks = -(-max_ctx // block_size)
        self.block_size = block_size
        self.blocks = block_tables[:, : self.num_blocks].to(torch.int64).reshape(-1)
        width = self.num_blocks * block_size
        valid = torch.arange(width, device=lens.device)[None, :] < lens[:, None]
        pad = (~valid).reshape(-1).nonzero().reshape(-1)
        self.valid = valid if pad.numel() else None
        self.pad_rows = pad if pad.numel() else None
        self._scratch: tuple[torch.Tensor, torch.Tensor] | None = None

    def read(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """K and V of every sequence, [B, num_blocks * block_size, Hkv, D], padding zeroed."""
        shape = (self.batch * self.num_blocks, *k_cache.shape[1:])
        bufs = self._scratch
        if bufs is None or bufs[0].shape != shape or bufs[0].dtype != k_cache.dtype:
            bufs = tuple(k_cache.new_empty(shape) for _ in range(2))
            self._scratch = bufs
        blocks = self.blocks.to(k_cache.device)
        out = []
        for cache, buf in zip((k_cache, v_cache), bufs, strict=True):
            torch.index_select(cache, 0, blocks, out=buf)
            rows = buf.view(-1, *cache.shape[2:])
            if self.pad_rows is not None:
                rows.index_fill_(0, self.pad_rows.to(rows.device), 0)
            out.append(rows.view(self.batch, -1, *cache.shape[2:]))
        return tuple(out)


def paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    gather: DecodeGather | None = None,
) -> torch.Tensor:
    """One query per sequence ([B, Hq, D]) attending to all its ``context_lens`` cached tokens.

    The used blocks are gathered into [B, N, Hkv, D] K/V (N: the longest context's
    blocks), padding zeroed and masked (one batched SDPA call, fp32); returns [B, Hq, D]
    in q's dtype. ``gather`` (a DecodeGather of these tables and lengths) lets the
    layers of one step share the index work and the scratch copies.
    """
    batch, num_heads, head_dim = q.shape
    if batch == 0:
        return torch.empty_like(q)
    if gather is None:
        gather = DecodeGather(block_tables[:batch], context_lens[:batch], k_cache.shape[1])
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    k, v = gather.read(k_cache, v_cache)
    mask = gather.valid
    # The query heads sharing a KV head become SDPA's query rows: [B, Hkv, G, D].
    qg = q.float().view(batch, num_kv_heads, group, head_dim)
    out = F.scaled_dot_product_attention(
        qg,
        k.float().permute(0, 2, 1, 3),
        v.float().permute(0, 2, 1, 3),
        attn_mask=None if mask is None else mask.to(q.device)[:, None, None, :],
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


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm of each row (``residual + x`` first, when given), as HF Llama rounds it:
    the norm in fp32, rounded to x's dtype, then scaled by the weight. Returns
    (normalised rows, the sum or None)."""
    total = None if residual is None else x + residual
    h = (x if total is None else total).to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), total


def rope_store_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
    cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Rotate q [T, Hq, D] and k [T, Hkv, D] (neox halves, cos/sin rows of ``cos_sin`` at
    ``positions`` rounded to q's dtype), store the rotated k and v at ``slot_mapping``;
    returns the rotated q."""
    half = q.shape[-1] // 2
    rows = cos_sin.index_select(0, positions[: q.shape[0]])
    c, s = rows[:, None, :half].to(q.dtype), rows[:, None, half:].to(q.dtype)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    store_kv_ref(rotate(k), v, k_cache, v_cache, slot_mapping)
    return rotate(q)
