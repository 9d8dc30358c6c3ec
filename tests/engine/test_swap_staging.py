"""Asynchronous copies go a bounded slice at a time through the staging slots and
move exactly what one copy at once moves, in every direction, in the order started."""

from __future__ import annotations

import random

import pytest
import torch

from fsd.engine.kv_cache import KVCachePool, KVShape
from fsd.engine.swapper import HostKVPool, Swapper
from fsd.errors import ConfigError
from fsd.kv.swap import SwapOp

SHAPE = KVShape(num_layers=3, num_kv_heads=2, head_dim=4, dtype=torch.float32)
CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")])]
BS = 4
BLOCK_BYTES = SHAPE.bytes_per_block(BS)


def _pools(n_dev: int = 24, n_host: int = 24, device: str = "cpu") -> tuple[KVCachePool, HostKVPool]:
    dev = KVCachePool(SHAPE, n_dev, BS, torch.device(device))
    host = HostKVPool(SHAPE, n_host, BS, pin=device == "cuda")
    dev.data.normal_()
    host.data.normal_()
    return dev, host


def _expected(
    dev: torch.Tensor, host: torch.Tensor, op: SwapOp
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both tiers after `op`, block by block (no slicing, no runs)."""
    dev, host = dev.cpu().clone(), host.clone()
    for s, d in zip(op.src, op.dst, strict=True):
        if op.direction == "out":
            host[d] = dev[:, :, s]
        elif op.direction == "in":
            dev[:, :, d] = host[s]
        else:
            dev[:, :, d] = dev[:, :, s].clone()
    return dev, host


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("direction", ["out", "in", "copy"])
@pytest.mark.parametrize("slice_blocks", [1, 3, 5, 64])
@pytest.mark.parametrize("layout", ["scattered", "adjacent"])
def test_a_sliced_copy_moves_what_a_copy_at_once_moves(direction, slice_blocks, layout, device):
    rng = random.Random(f"{direction}{slice_blocks}{layout}")
    dev, host = _pools(device=device)
    n = 11
    src_pool = dev.num_blocks if direction != "in" else host.num_blocks
    dst_pool = host.num_blocks if direction == "out" else dev.num_blocks
    if layout == "adjacent":
        first = rng.randrange(dst_pool - n + 1)
        dst = list(range(first, first + n))
    else:
        dst = rng.sample(range(dst_pool), n)
    avoid = set(dst) if direction == "copy" else set()  # a copy within the device
    src = rng.sample([b for b in range(src_pool) if b not in avoid], n)
    op = SwapOp(None, direction, src, dst, False)
    want_dev, want_host = _expected(dev.data, host.data, op)
    swapper = Swapper(dev, host, slice_bytes=slice_blocks * BLOCK_BYTES)
    try:
        assert swapper.staging.slice_blocks == min(slice_blocks, dev.num_blocks)
        swapper.start([op])
        assert [o.src for o in swapper.wait(timeout=30)] == [src]
        assert swapper.take_failed() == []
        assert torch.equal(dev.data.cpu(), want_dev) and torch.equal(host.data, want_host)
        assert swapper.staging.slices == -(-len(src) // swapper.staging.slice_blocks)
    finally:
        swapper.close()


@pytest.mark.parametrize("device", DEVICES)
def test_batches_are_copied_in_the_order_started_and_counted_once(device):
    """A swap-in started after a swap-out reads the host blocks that swap-out wrote."""
    dev, host = _pools(device=device)
    before = dev.data.clone()
    swapper = Swapper(dev, host, slice_bytes=2 * BLOCK_BYTES)
    try:
        out = SwapOp(None, "out", [3, 4, 5, 9, 1], [7, 8, 2, 3, 4], False)
        back = SwapOp(None, "in", [7, 8, 2, 3, 4], [10, 11, 12, 0, 6], False)
        swapper.start([out])
        swapper.start([back])
        done = []
        while swapper.busy:
            done += swapper.wait(timeout=30)
        assert done == [out, back]
        for s, b in zip(out.src, back.dst, strict=True):
            assert torch.equal(dev.data[:, :, b], before[:, :, s])
        assert swapper.bytes_out == swapper.bytes_in == 5 * BLOCK_BYTES
        assert swapper.staging.slices == 6  # 3 slices of at most 2 blocks each way
    finally:
        swapper.close()


def test_staging_is_bounded_by_the_slice_and_never_larger_than_the_pool():
    dev, host = _pools(n_dev=6)
    big = Swapper(dev, host, slice_bytes=1 << 30)
    small = Swapper(dev, host, slice_bytes=1)
    try:
        assert big.staging.slice_blocks == 6 and small.staging.slice_blocks == 1
        assert small.staging.nbytes == 2 * 2 * BLOCK_BYTES  # two slots of two buffers
    finally:
        big.close()
        small.close()


def test_a_host_pool_that_cannot_be_had_says_what_it_needs(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(torch, "zeros", refuse)
    with pytest.raises(
        ConfigError, match=r"needs 0\.0 GiB of pinned host memory \(8 blocks\).*out of memory"
    ):
        HostKVPool(SHAPE, 8, BS, pin=True)
