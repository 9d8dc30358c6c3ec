"""The vectorised batch layout against a per-token loop, and the torch decode's shared gather."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from fsd.kernels import reference
from fsd.layers.attention import AttentionMetadata, HostLayout


def loop_layout(query_lens, context_lens, block_tables, block_size):
    """The layout written the slow, obvious way (what the vectorised build must equal)."""
    slots, positions = [], []
    for q, c, table in zip(query_lens, context_lens, block_tables, strict=True):
        for pos in range(c - q, c):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            positions.append(pos)
    width = max((len(t) for t in block_tables), default=1) or 1
    tables = [list(t) + [0] * (width - len(t)) for t in block_tables]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    num_decodes = 0
    for q in query_lens:
        if q != 1:
            break
        num_decodes += 1
    return slots, positions, tables or [[0]][:0], starts, num_decodes


def random_batch(rng: random.Random, block_size: int):
    n = rng.randint(0, 12)
    decodes = rng.randint(0, n)
    query_lens, context_lens, tables = [], [], []
    free = list(range(2000))
    rng.shuffle(free)
    for s in range(n):
        q = 1 if s < decodes else rng.randint(1, 40)
        c = q + rng.randint(0, 60)
        nb = -(-c // block_size) + rng.randint(0, 2)  # tables may hold spare blocks
        query_lens.append(q)
        context_lens.append(c)
        tables.append(tuple(free.pop() for _ in range(nb)))
    return query_lens, context_lens, tables


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_vectorised_layout_equals_the_loop(block_size):
    rng = random.Random(block_size)
    for _ in range(200):
        q, c, tables = random_batch(rng, block_size)
        layout = HostLayout.build(q, c, tables, block_size)
        slots, positions, padded, starts, nd = loop_layout(q, c, tables, block_size)
        assert layout.slot_mapping.tolist() == slots
        assert layout.positions.tolist() == positions
        assert layout.block_tables.shape == (len(q), max(1, max(map(len, tables), default=1)))
        if q:
            assert layout.block_tables.tolist() == padded
        assert layout.query_start_loc.tolist() == starts
        assert layout.context_lens.tolist() == c
        assert layout.num_decodes == nd
        assert layout.max_query_len == max(q, default=0)
        assert layout.max_context_len == max(c, default=0)
        meta = AttentionMetadata.build(q, c, tables, block_size)
        assert meta.slot_mapping.dtype == torch.int64 and meta.block_tables.dtype == torch.int32
        assert meta.context_lens.dtype == torch.int32 and meta.query_start_loc.dtype == torch.int32
        assert meta.slot_mapping.tolist() == slots and meta.num_seqs == len(q)


def test_layout_rejects_what_the_loop_rejected():
    with pytest.raises(ValueError, match="query_len 0"):
        HostLayout.build([1, 0], [3, 4], [(0,), (1,)], 16)
    with pytest.raises(ValueError, match="query_len 5"):
        HostLayout.build([5], [4], [(0,)], 16)
    with pytest.raises(ValueError, match="cannot hold 17"):
        HostLayout.build([1], [17], [(0,)], 16)
    with pytest.raises(ValueError, match="differ in length"):
        HostLayout.build([1, 1], [3], [(0,)], 16)
    empty = HostLayout.build([], [], [], 16)
    assert empty.block_tables.shape == (0, 1) and empty.query_start_loc.tolist() == [0]


def test_empty_tables_of_equal_width_stay_zero_padded():
    layout = HostLayout.build([1, 1], [1, 1], [(7,), (9,)], 16)
    assert layout.block_tables.tolist() == [[7], [9]]
    assert layout.slot_mapping.tolist() == [7 * 16, 9 * 16]
    assert isinstance(layout.slot_mapping, np.ndarray)


@pytest.mark.parametrize("block_size", [1, 16])
def test_shared_decode_gather_equals_a_fresh_one_and_zeroes_nan_padding(block_size):
    gen = torch.Generator().manual_seed(0)
    lens = [1, 15, 33, 16]
    hkv, group, dim = 2, 3, 8
    nb = 8 * (16 // block_size) + 40
    k_cache = torch.full((nb, block_size, hkv, dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    tables, used = [], 0
    for n in lens:
        blocks = list(range(used, used + -(-n // block_size)))
        used += len(blocks)
        tables.append(tuple(blocks))
        for p in range(n):
            k_cache[blocks[p // block_size], p % block_size] = torch.randn(hkv, dim, generator=gen)
            v_cache[blocks[p // block_size], p % block_size] = torch.randn(hkv, dim, generator=gen)
    meta = AttentionMetadata.build([1] * len(lens), lens, tables, block_size)
    q = torch.randn(len(lens), hkv * group, dim, generator=gen)
    gather = meta.decode_gather(block_size)
    assert meta.decode_gather(block_size) is gather  # one per step
    fresh = reference.paged_decode_ref(
        q, k_cache, v_cache, meta.block_tables, meta.context_lens, 0.3
    )
    for _ in range(2):  # the scratch copies are reused: a second layer reads the same
        shared = reference.paged_decode_ref(
            q, k_cache, v_cache, meta.block_tables, meta.context_lens, 0.3, gather=gather
        )
        assert not torch.isnan(shared).any()
        torch.testing.assert_close(shared, fresh, atol=0, rtol=0)
