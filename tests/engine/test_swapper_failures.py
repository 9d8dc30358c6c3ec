"""A failed asynchronous copy loses its own job's KV only: the other copies of the
same batch are made and reported done, not failed."""

from __future__ import annotations

import pytest
import torch

from fsd.engine.kv_cache import KVCachePool, KVShape
from fsd.engine.swapper import HostKVPool, Swapper, _raise_if_failed
from fsd.kv.swap import SwapOp


class _Job:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id


def test_one_failing_copy_in_a_batch_fails_that_copy_alone(monkeypatch):
    shape = KVShape(num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32)
    device = KVCachePool(shape, 8, 4, torch.device("cpu"))
    host = HostKVPool(shape, 8, 4, pin=False)
    device.data.normal_()
    swapper = Swapper(device, host)
    doomed, kept = _Job("doomed"), _Job("kept")
    ops = [SwapOp(doomed, "out", [0], [0], False), SwapOp(kept, "out", [1], [1], False)]
    real = Swapper._copy

    def copy(self: Swapper, op: SwapOp, keep: list) -> None:
        if op.job is doomed:
            raise OSError("DMA engine on fire")
        real(self, op, keep)

    monkeypatch.setattr(Swapper, "_copy", copy)
    swapper.start(ops)
    done = swapper.wait(timeout=10)
    assert {op.job.job_id for op in done} == {"doomed", "kept"}
    failed = swapper.take_failed()
    assert [(op.job.job_id, "DMA engine on fire" in why) for op, why in failed] == [
        ("doomed", True)
    ]
    # the other copy was made: block 1 of every layer is on the host now
    assert torch.equal(host.data[1], device.data[:, :, 1])
    swapper.close()
    again = Swapper(device, host)  # a pipeline stage waiting on the batch hears of it
    handle = again.start(ops)
    with pytest.raises(RuntimeError, match="DMA engine on fire"):
        _raise_if_failed(handle)
    again.close()
