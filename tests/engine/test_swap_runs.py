"""The swapper copies runs of adjacent host blocks at once: the runs cover every
block, in order, each run really adjacent, and a round trip keeps the KV exact."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from fsd.engine.swapper import runs


@given(st.lists(st.integers(0, 40), max_size=40))
def test_runs_cover_the_blocks_in_order(blocks):
    got = runs(blocks)
    rebuilt = [first + i for _, first, n in got for i in range(n)]
    assert rebuilt == blocks
    assert [k for k, _, _ in got] == [sum(n for _, _, n in got[:i]) for i in range(len(got))]
    for (_, a, n), (_, b, _) in zip(got, got[1:], strict=False):
        assert a + n != b  # a run ends where adjacency does


def test_runs_of_scattered_and_adjacent_blocks():
    assert runs([]) == []
    assert runs([5, 6, 7, 2, 3, 9]) == [(0, 5, 3), (3, 2, 2), (5, 9, 1)]
    assert runs([4, 3]) == [(0, 4, 1), (1, 3, 1)]  # descending is not a run


def test_a_swap_round_trip_through_runs_keeps_every_block():
    from fsd.engine.kv_cache import KVCachePool, KVShape
    from fsd.engine.swapper import HostKVPool, Swapper
    from fsd.kv.swap import SwapOp

    shape = KVShape(num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32)
    dev = KVCachePool(shape, 16, 4, torch.device("cpu"))
    host = HostKVPool(shape, 16, 4, pin=False)
    dev.data.copy_(torch.randn_like(dev.data))
    before = dev.data.clone()
    swapper = Swapper(dev, host)
    try:
        src, mid = [3, 4, 5, 9, 1], [7, 8, 2, 3, 4]
        swapper.run_sync([SwapOp(None, "out", src, mid)])
        back = [10, 11, 12, 0, 6]
        swapper.run_sync([SwapOp(None, "in", mid, back)])
        for s, b in zip(src, back, strict=True):
            assert torch.equal(dev.data[:, :, b], before[:, :, s])
    finally:
        swapper.close()
