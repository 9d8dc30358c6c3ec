"""Paged decode's host plan (chunk, grid, how grouped heads multiply) as plain Python, and
the kernel against the reference: ragged batches, empty splits, contexts that fill their
chunks, both ways of multiplying, every head layout, block size, head dim and dtype
(Triton's interpreter on a CPU)."""

from __future__ import annotations

import importlib

import pytest
import torch

from fsd.kernels import reference
from fsd.kernels.launch import ROW_GROUP_MAX, choose_chunk, decode_chunking, decode_group_tile
from tests.kernels.test_kernels import Paged, _decode_case, _run_decode, assert_close

decode_module = importlib.import_module("fsd.kernels.paged_decode")
uses_triton = pytest.mark.usefixtures("triton_ready")
pytestmark = pytest.mark.gpu  # also run on the device machine (scripts/gpu-check.sh)
both_products = pytest.mark.parametrize("use_dot", [False, True], ids=["rows", "dot"])
H200_SMS = 132


def _check(q: torch.Tensor, paged: Paged, scale: float, dtype: torch.dtype, **kw) -> None:
    out = _run_decode(q, paged, scale, **kw)
    assert_close(out, _run_decode(q, paged, scale, reference.paged_decode_ref), dtype)


def _widen(paged: Paged, width: int) -> Paged:
    """The same batch with block tables padded to `width` columns (a larger bound)."""
    tables = paged.block_tables
    wide = tables.new_zeros((tables.shape[0], width))
    wide[:, : tables.shape[1]] = tables
    return Paged(paged.k_cache, paged.v_cache, wide, paged.context_lens)


# ----------------------------------------------------------------------------- host plan


def test_the_chunk_fills_the_gpu_from_the_longest_context():
    assert choose_chunk(16, 8, 2048, 64, H200_SMS) == 512  # 4 chunks x 128 programs
    assert choose_chunk(1, 8, 2048, 64, H200_SMS) == 256  # no chunk under 256 tokens
    assert choose_chunk(256, 8, 2048, 64, H200_SMS) == 2048  # a full GPU: one chunk, no merge
    assert choose_chunk(16, 8, 100, 64, H200_SMS) == 128  # a short batch: one chunk


def test_a_long_sequence_is_cut_even_when_the_batch_fills_the_gpu():
    assert choose_chunk(64, 8, 8192, 64, H200_SMS) == 2048
    assert choose_chunk(64, 8, 8192, 64, H200_SMS, max_chunk=4096) == 4096
    chunk = choose_chunk(1, 1, 10**6, 64, H200_SMS)  # past the split cap the chunk grows
    assert -(-(10**6) // chunk) == 64


@pytest.mark.parametrize("block_n", [16, 32, 64])
def test_every_chunk_is_whole_tiles_and_at_most_64_cover_the_context(block_n):
    for batch in (1, 3, 16, 64, 300):
        for heads in (1, 8):
            for context in (1, 63, 300, 2048, 32768, 10**6):
                chunk = choose_chunk(batch, heads, context, block_n, H200_SMS)
                splits = -(-context // chunk)
                assert chunk % block_n == 0 and 1 <= splits <= 64
                assert chunk <= max(2048, -(-context // 64) + block_n)


def test_the_grid_is_sized_by_the_context_given_not_the_table():
    # the table's bound (32k) would cut 16 chunks; the batch's real longest needs 4
    assert decode_chunking(16, 8, 32768, 64, H200_SMS) == (2048, 16)
    assert decode_chunking(16, 8, 2048, 64, H200_SMS) == (512, 4)
    assert decode_chunking(16, 8, 2000, 64, H200_SMS) == (512, 4)
    assert decode_chunking(16, 8, 2048, 64, H200_SMS, num_splits=3) == (704, 3)
    assert decode_chunking(2, 1, 300, 64, num_splits=64) == (64, 5)  # one tile per chunk
    assert decode_chunking(2, 1, 0, 64) == (64, 1)


def test_one_head_per_kv_head_multiplies_without_tl_dot():
    assert ROW_GROUP_MAX == 1
    assert decode_group_tile(1) == (False, 1)  # MHA: no 16-row padding
    assert [decode_group_tile(g) for g in (2, 4, 8)] == [(True, 16)] * 3  # tl.dot pads to 16
    assert decode_group_tile(32) == (True, 32)
    assert decode_group_tile(1, use_dot=True) == (True, 16)
    assert decode_group_tile(3, use_dot=False) == (False, 4)
    assert decode_group_tile(8, use_dot=False) == (False, 8)


# ----------------------------------------------------------------------------- kernel


@uses_triton
@both_products
def test_a_ragged_batch_with_the_heuristic_chunk(use_dot, device):
    # chunk 224: three sequences of one chunk (written directly), two merged
    lens = [1, 5, 17, 300, 1030]
    q, paged = _decode_case(device, torch.float32, 2, lens, block_size=16, dim=16)
    assert decode_chunking(5, 2, max(lens), 32) == (224, 5)
    _check(q, paged, 0.3, torch.float32, max_context=max(lens), use_dot=use_dot, block_n=32)


@uses_triton
@both_products
def test_sequences_with_many_empty_splits(use_dot, device):
    # a table bound of 1024 tokens cut in 32 chunks of 32: most programs have no keys
    q, paged = _decode_case(device, torch.float32, 2, [1, 2, 40], block_size=16, dim=16)
    wide = _widen(paged, 64)
    _check(q, wide, 0.3, torch.float32, num_splits=32, use_dot=use_dot, block_n=32)
    _check(q, wide, 0.3, torch.float32, use_dot=use_dot, block_n=32)  # 4 chunks, 3 empty


@uses_triton
@both_products
def test_contexts_that_are_exact_multiples_of_the_chunk(use_dot, device):
    lens = [256, 512, 32]
    q, paged = _decode_case(device, torch.float32, 4, lens, block_size=32, dim=16, hkv=1)
    assert decode_chunking(3, 1, 512, 64)[0] == 256
    _check(q, paged, 0.3, torch.float32, max_context=512, use_dot=use_dot)


@uses_triton
@both_products
@pytest.mark.parametrize(
    ("hkv", "group"),
    [(4, 1), (2, 2), (2, 4), (1, 8), (1, 6)],
    ids=["mha", "g2", "g4", "mqa8", "mqa6"],
)
def test_every_head_layout(hkv, group, use_dot, device):
    q, paged = _decode_case(
        device, torch.float32, group, [3, 40, 129], block_size=16, dim=32, hkv=hkv
    )
    _check(q, paged, 0.25, torch.float32, num_splits=4, use_dot=use_dot, block_n=32)


@uses_triton
@pytest.mark.parametrize(
    ("block_size", "block_n"), [(1, 32), (16, 32), (32, 32), (64, 32), (128, 64), (24, 16)]
)
@both_products
def test_every_block_size(block_size, block_n, use_dot, device):
    # pages smaller than a tile, equal, larger (one id per tile) and neither dividing
    q, paged = _decode_case(device, torch.float32, 2, [1, 33, 200], block_size=block_size, dim=16)
    _check(q, paged, 0.3, torch.float32, num_splits=3, block_n=block_n, use_dot=use_dot)


@uses_triton
@both_products
@pytest.mark.parametrize("dim", [64, 80, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_head_dims_and_dtypes(dim, dtype, use_dot, device):
    q, paged = _decode_case(device, dtype, 4, [1, 70], block_size=16, dim=dim, hkv=1)
    _check(q, paged, dim**-0.5, dtype, max_context=70, num_splits=2, block_n=32, use_dot=use_dot)


@uses_triton
def test_no_merge_when_the_longest_context_fits_one_chunk(device, monkeypatch):
    q, paged = _decode_case(device, torch.float32, 2, [3, 50, 90], block_size=16, dim=16)
    wide = _widen(paged, 256)  # a 4096-token bound: the table alone would ask for a merge
    merges = []
    real = decode_module._merge
    monkeypatch.setattr(decode_module, "_merge", lambda *a: merges.append(a) or real(*a))
    _check(q, wide, 0.3, torch.float32, max_context=90)
    assert not merges
    _check(q, wide, 0.3, torch.float32)
    assert len(merges) == 1


@uses_triton
@pytest.mark.slow
@both_products
def test_a_ramp_up_to_2048_tokens(use_dot, device):
    lens = [128 * (i + 1) for i in range(16)][::-1]
    q, paged = _decode_case(device, torch.float16, 4, lens, block_size=16, dim=64, hkv=1)
    _check(q, paged, 0.125, torch.float16, max_context=2048, use_dot=use_dot)
