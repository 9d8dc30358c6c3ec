"""Paged attention layer and the per-iteration batch layout it reads.

A step's batch is flattened: the new tokens of every sequence stand one after the
other. Decode sequences (exactly one new token) come first, prefills after, so the
decode kernel and the prefill kernel each see one contiguous slice.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fsd.kernels import reference


def upload(array: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """A host array as a tensor on `device`: shared memory on the CPU; on a GPU a copy
    from pinned memory that does not block the host (the caching host allocator keeps
    the pinned buffer until the copy has run)."""
    host = torch.from_numpy(array)
    device = torch.device(device)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


@dataclass
class HostLayout:
    """A batch's layout in host (numpy) arrays: what `AttentionMetadata` holds on the device."""

    slot_mapping: np.ndarray  # [T] int64
    block_tables: np.ndarray  # [S, max_blocks] int32, padded with 0
    context_lens: np.ndarray  # [S] int32
    query_start_loc: np.ndarray  # [S + 1] int32
    positions: np.ndarray  # [T] int64: each new token's position
    num_decodes: int
    max_query_len: int
    max_context_len: int

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        context_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]] | np.ndarray,
        block_size: int,
        widths: np.ndarray | None = None,
    ) -> HostLayout:
        """Vectorised: a few numpy operations whatever the batch (no per-token loop).

        `block_tables`: one sequence of block ids per sequence, or (with `widths`, each
        table's length) an array of them padded with 0 (fsd.engine.block_tables)."""
        n = len(query_lens)
        if len(context_lens) != n or len(block_tables) != n:
            raise ValueError("query_lens, context_lens and block_tables differ in length")
        c = np.fromiter(context_lens, np.int64, n)
        if widths is None:
            widths = np.fromiter(map(len, block_tables), np.int64, n)
        decode_only = query_lens.count(1) == n
        q = c if decode_only else np.fromiter(query_lens, np.int64, n)  # (c: a stand-in)
        if (
            (not decode_only and min(query_lens) < 1)
            or (c < (1 if decode_only else q)).any()
            or (widths * block_size < c).any()
        ):
            _refuse(query_lens, context_lens, widths, block_size)
        width = int(widths.max()) if n else 0
        tables = np.zeros((n, max(width, 1)), np.int64)
        total = int(widths.sum())
        if isinstance(block_tables, np.ndarray):
            tables[:, :width] = block_tables[:, :width]
        elif total == n * width:  # every table as wide: one conversion
            flat = np.fromiter(itertools.chain.from_iterable(block_tables), np.int64, total)
            tables[:, :width] = flat.reshape(n, width)
        elif total:
            flat = np.fromiter(itertools.chain.from_iterable(block_tables), np.int64, total)
            tables[np.arange(width)[None, :] < widths[:, None]] = flat
        if decode_only:  # one new token per sequence, at context_len - 1
            starts = np.arange(n + 1, dtype=np.int32)
            num_decodes, rows, pos = n, starts[:-1], c - 1
        else:
            starts = np.zeros(n + 1, np.int32)
            np.cumsum(q, out=starts[1:])
            num_decodes = int((q != 1).argmax())
            # A later one-token sequence is fine: the prefill kernel handles any query length.
            rows = np.repeat(np.arange(n), q)
            pos = np.arange(int(starts[-1])) - starts[rows] + (c - q)[rows]
        slots = tables[rows, pos // block_size] * block_size + pos % block_size
        return cls(
            slot_mapping=slots,
            block_tables=tables.astype(np.int32),
            context_lens=c.astype(np.int32),
            query_start_loc=starts,
            positions=pos,
            num_decodes=num_decodes,
            max_query_len=max(query_lens, default=0),
            max_context_len=max(context_lens, default=0),
        )

    def to_device(self, device: torch.device | str = "cpu") -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=upload(self.slot_mapping, device),
            block_tables=upload(self.block_tables, device),
            context_lens=upload(self.context_lens, device),
            query_start_loc=upload(self.query_start_loc, device),
            num_decodes=self.num_decodes,
            max_query_len=self.max_query_len,
            max_context_len=self.max_context_len,
        )


def _refuse(
    query_lens: Sequence[int], context_lens: Sequence[int], widths: np.ndarray, block_size: int
) -> None:
    """Raise for the first sequence whose lengths or table do not fit."""
    for q, c, w in zip(query_lens, context_lens, widths.tolist(), strict=True):
        if q < 1 or q > c:
            raise ValueError(f"query_len {q} must be in [1, context_len {c}]")
        if w * block_size < c:
            raise ValueError(f"block table of {w} blocks cannot hold {c} tokens")


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
    # work every layer of the step shares (the torch decode's DecodeGather), made once
    shared: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

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
        return HostLayout.build(query_lens, context_lens, block_tables, block_size).to_device(
            device
        )

    def decode_gather(self, block_size: int) -> reference.DecodeGather:
        """The decode sequences' cache reads for the torch decode, made once per step."""
        gather = self.shared.get("decode_gather")
        if gather is None:
            nd = self.num_decodes
            gather = reference.DecodeGather(
                self.block_tables[:nd], self.context_lens[:nd], block_size
            )
            self.shared["decode_gather"] = gather
        return gather


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
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """`rope` (positions, the rotary cos/sin cache): rotate q and k first, fused with
        the K/V store (one kernel on the Triton backend)."""
        backend = resolve_backend(self.backend, q.device)
        ops = _ops(backend)
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        if rope is None:
            ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        else:
            q = ops.rope_store(q, k, v, *rope, k_cache, v_cache, meta.slot_mapping)

        nd = meta.num_decodes
        # a decode-only step (the common one) takes the kernel's output as it is: no copy
        out = None if nd == meta.num_seqs else torch.empty_like(q)
        if nd:
            decoded = ops.paged_decode(
                q[:nd],
                k_cache,
                v_cache,
                meta.block_tables[:nd],
                meta.context_lens[:nd],
                self.scale,
                # the torch decode shares its gather plan and scratch across the layers; the
                # Triton kernel cuts its chunks by the longest context (no device sync)
                **(
                    {"gather": meta.decode_gather(k_cache.shape[1])}
                    if backend == "torch"
                    else {"max_context": meta.max_context_len}
                ),
            )
            if out is None:
                return decoded.view(num_tokens, self.num_heads * self.head_dim)
            out[:nd] = decoded
        assert out is not None
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
    def __init__(self, store_kv, paged_decode, paged_prefill, rope_store) -> None:  # noqa: ANN001
        self.store_kv = store_kv
        self.paged_decode = paged_decode
        self.paged_prefill = paged_prefill
        self.rope_store = rope_store


def _ops(backend: str) -> _Ops:
    if backend == "triton":
        from fsd.kernels import paged_decode, paged_prefill, rope_store, store_kv

        return _Ops(store_kv, paged_decode, paged_prefill, rope_store)
    if backend == "torch":
        ref = reference
        return _Ops(ref.store_kv_ref, ref.paged_decode_ref, ref.paged_prefill_ref, ref.rope_store_ref)
    raise ValueError(f"unknown attention backend {backend!r}")
