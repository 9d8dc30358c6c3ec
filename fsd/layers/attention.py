"""Paged attention layer and the per-iteration batch layout it reads.

A step's batch is flattened: the new tokens of every sequence stand one after the
other. Decode sequences (exactly one new token) come first, prefills after, so the
decode kernel and the prefill kernel each see one contiguous slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fsd.kernels import reference


@dataclass
class AttentionMetadata:
    """Where each new token's K/V goes and what each sequence attends to."""

    slot_mapping: torch.Tensor  # [T] int64: cache slot (block * block_size + offset) per new token
    block_tables: torch.Tensor  # [S, max_blocks] int32, padded with 0
    context_lens: torch.Tensor  # [S] int32: tokens in the cache after this step (incl. new)
    query_start_loc: torch.Tensor  # [S + 1] int32: offsets of each sequence's new tokens
    num_decodes: int  # the first num_decodes sequences have exactly one new token
    max_query_len: int
    max_context_len: int

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        context_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Lay out a batch. Sequences with query_len 1 must come first.

        The new tokens of sequence s sit at positions [context_len - query_len, context_len).
        """
        num_decodes = 0
        for q in query_lens:
            if q != 1:
                break
            num_decodes += 1
        # A later one-token sequence is fine: the prefill kernel handles any query length.
        slots: list[int] = []
        for q, c, table in zip(query_lens, context_lens, block_tables, strict=True):
            if q < 1 or q > c:
                raise ValueError(f"query_len {q} must be in [1, context_len {c}]")
            if len(table) * block_size < c:
                raise ValueError(f"block table of {len(table)} blocks cannot hold {c} tokens")
            for pos in range(c - q, c):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        width = max((len(t) for t in block_tables), default=1) or 1
        tables = torch.zeros((len(block_tables), width), dtype=torch.int32)
        for i, t in enumerate(block_tables):
            if t:
                tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=tables.to(device),
            context_lens=torch.tensor(list(context_lens), dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            num_decodes=num_decodes,
            max_query_len=max(query_lens, default=0),
            max_context_len=max(context_lens, default=0),
        )


def resolve_backend(name: str, device: torch.device) -> str:
    """`auto` picks Triton on CUDA and the torch reference elsewhere."""
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return name


class PagedAttention(torch.nn.Module):
    """Stores this step's K/V into the paged cache, then attends over the cache.

    Takes q [T, num_heads * head_dim], k and v [T, num_kv_heads * head_dim];
    kv_cache is (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim].
    """

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, backend: str = "auto"
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of kv heads {num_kv_heads}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.backend = backend

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        backend = resolve_backend(self.backend, q.device)
        ops = _ops(backend)
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)

        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = ops.paged_decode(
                q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.context_lens[:nd], self.scale
            )
        if nd < meta.num_seqs:
            starts = meta.query_start_loc[nd:] - meta.query_start_loc[nd]
            out[nd:] = ops.paged_prefill(
                q[nd:],
                k_cache,
                v_cache,
                meta.block_tables[nd:],
                meta.context_lens[nd:],
                starts,
                self.scale,
                # the Triton kernel sizes its grid from this instead of syncing to read it
                **({"max_query_len": meta.max_query_len} if backend == "triton" else {}),
            )
        return out.view(num_tokens, self.num_heads * self.head_dim)


class _Ops:
    def __init__(self, store_kv, paged_decode, paged_prefill) -> None:  # noqa: ANN001
        self.store_kv = store_kv
        self.paged_decode = paged_decode
        self.paged_prefill = paged_prefill


def _ops(backend: str) -> _Ops:
    if backend == "triton":
        from fsd.kernels import paged_decode, paged_prefill, store_kv

        return _Ops(store_kv, paged_decode, paged_prefill)
    if backend == "torch":
        return _Ops(reference.store_kv_ref, reference.paged_decode_ref, reference.paged_prefill_ref)
    raise ValueError(f"unknown attention backend {backend!r}")
