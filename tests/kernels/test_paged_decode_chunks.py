"""Paged decode cut by fixed chunks: every sequence of a ragged batch is cut by the
same chunk, programs past a sequence's end do nothing, a sequence of one chunk skips
the merge, and the answer is the reference's for every layout (Triton's interpreter
on a CPU)."""

from __future__ import annotations

import pytest
import torch

from fsd.kernels import reference
from fsd.kernels.launch import fixed_chunk
from tests.kernels.test_kernels import _decode_case, _run_decode, assert_close

uses_triton = pytest.mark.usefixtures("triton_ready")
pytestmark = pytest.mark.gpu  # also run on the device machine (scripts/gpu-check.sh)
RAGGED = [1, 5, 17, 64, 65, 130, 300]


def test_a_fixed_chunk_is_whole_tiles_and_covers_the_longest_context():
    assert fixed_chunk(2048, 4, 64) == (512, 4)
    assert fixed_chunk(300, 64, 64) == (64, 5)  # more splits than tiles: one tile each
    assert fixed_chunk(192, 3, 64) == (64, 3)
    assert fixed_chunk(100, 1, 64) == (128, 1)
    for context in (1, 63, 64, 65, 1000, 4097):
        for splits in (1, 2, 3, 7, 64):
            chunk, n = fixed_chunk(context, splits, 32)
            assert chunk % 32 == 0 and n * chunk >= context > (n - 1) * chunk and n <= splits


@uses_triton
@pytest.mark.parametrize("num_splits", [1, 2, 3, 8])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_a_ragged_batch_gives_the_reference_for_any_chunk(num_splits, block_size, device):
    q, paged = _decode_case(device, torch.float32, 2, RAGGED, block_size=block_size, dim=16)
    out = _run_decode(q, paged, 0.3, num_splits=num_splits, block_n=32)
    assert_close(out, _run_decode(q, paged, 0.3, reference.paged_decode_ref), torch.float32)


@uses_triton
@pytest.mark.parametrize(("hkv", "group"), [(4, 1), (2, 2), (2, 4), (1, 8), (1, 3)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_head_layout_and_half_precision(hkv, group, dtype, device):
    q, paged = _decode_case(device, dtype, group, [3, 40, 129], block_size=16, dim=32, hkv=hkv)
    out = _run_decode(q, paged, 0.25, num_splits=4, block_n=32)
    assert_close(out, _run_decode(q, paged, 0.25, reference.paged_decode_ref), dtype)


@uses_triton
@pytest.mark.parametrize("dim", [64, 80, 128])
def test_contexts_that_fill_their_chunks_exactly(dim, device):
    # chunk 64: the sequences end on a chunk's last token; one of them is one chunk long
    q, paged = _decode_case(device, torch.float32, 2, [64, 128, 192], block_size=16, dim=dim, hkv=1)
    out = _run_decode(q, paged, dim**-0.5, num_splits=3, block_n=64)
    assert_close(out, _run_decode(q, paged, dim**-0.5, reference.paged_decode_ref), torch.float32)


@uses_triton
def test_the_merge_reads_only_the_chunks_a_sequence_has(device, monkeypatch):
    """Partials start as NaN: a merge that read a split no program wrote would show it."""
    real_empty = torch.Tensor.new_empty

    def nan_filled(self, *args, **kwargs):
        made = real_empty(self, *args, **kwargs)
        return made.fill_(float("nan")) if made.is_floating_point() else made

    monkeypatch.setattr(torch.Tensor, "new_empty", nan_filled)
    q, paged = _decode_case(device, torch.float32, 2, [10, 300, 100], block_size=16, dim=16)
    out = _run_decode(q, paged, 0.3, num_splits=4, block_n=32)
    assert not out.isnan().any()
    assert_close(out, _run_decode(q, paged, 0.3, reference.paged_decode_ref), torch.float32)
