"""Asynchronous KV copies cut into bounded slices through preallocated staging buffers.

Why: a swap moved as one piece hid nothing. Gathering a whole swap-out allocated its
size again on the device (an allocation that may synchronise the device when the
cache is short), and one copy of gigabytes sat on the copy engine ahead of the step's
own small device-to-host read (its sampled tokens), so the step ended when the swap
did. Here a copy moves at most `slice_blocks` blocks at a time through one of `depth`
staging slots allocated once; the copier (one thread) waits for a slot's previous
slice to end before it reuses it, so at most `depth` slices are ever queued ahead of
the step's work, and nothing is allocated per copy. Each slice orders itself after
the compute stream only through the event `Swapper.start` recorded, so the step never
waits for a copy it does not read.

On CPU the same slices run (no streams, no events): tests prove the layout, the
slicing and the order with the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

SLICE_BYTES_CUDA = 16 << 20  # one slice: a small fraction of a decode step on PCIe
SLICE_BYTES_CPU = 4 << 20
DEPTH = 2  # slices queued at once: one copying while the next is prepared


class _Slot:
    """One staging slot: a pool-major and a block-major buffer, index buffers (device,
    and pinned host ones to fill them from), and the event of the slice that last used it."""

    def __init__(
        self, per_block: int, blocks: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        cuda = device.type == "cuda"
        self.gather = torch.empty(blocks * per_block, dtype=dtype, device=device)
        self.stage = torch.empty(blocks * per_block, dtype=dtype, device=device)
        self.index = torch.empty(2 * blocks, dtype=torch.long, device=device)
        self.host_index = torch.empty(2 * blocks, dtype=torch.long, pin_memory=cuda)
        self.event: Any = torch.cuda.Event() if cuda else None
        self.used = False

    def indices(self, *ids: Sequence[int]) -> list[torch.Tensor]:
        """`ids` as index tensors on the device (uploaded from pinned memory)."""
        n = len(ids[0])
        for k, part in enumerate(ids):
            self.host_index[k * n : (k + 1) * n] = torch.as_tensor(part, dtype=torch.long)
        flat = self.index[: len(ids) * n]
        flat.copy_(self.host_index[: len(ids) * n], non_blocking=True)
        return [flat[k * n : (k + 1) * n] for k in range(len(ids))]


class Staging:
    """The copier's slots and the three slice copies (module doc). `dev` is the device
    pool's tensor [L, 2, NB, BS, H, D]; `host` the host pool's [NB, L, 2, BS, H, D]."""

    def __init__(
        self, dev: torch.Tensor, host: torch.Tensor, slice_bytes: int | None = None
    ) -> None:
        self.dev, self.host = dev, host
        self.cuda = dev.is_cuda
        self.block = (dev.shape[0], dev.shape[1], *dev.shape[3:])  # one block's [L, 2, BS, H, D]
        per_block = dev[:, :, 0].numel()
        self.block_bytes = per_block * dev.element_size()
        budget = slice_bytes or (SLICE_BYTES_CUDA if self.cuda else SLICE_BYTES_CPU)
        self.slice_blocks = max(1, min(budget // max(self.block_bytes, 1), dev.shape[2]))
        self.slots = [
            _Slot(per_block, self.slice_blocks, dev.dtype, dev.device) for _ in range(DEPTH)
        ]
        self._next = 0
        self.slices = 0  # slices copied (for tests and telemetry)

    @property
    def nbytes(self) -> int:
        return 2 * len(self.slots) * self.slice_blocks * self.block_bytes

    def copy(self, direction: str, src: Sequence[int], dst: Sequence[int]) -> int:
        """Copy blocks `src` of one tier to `dst` ("out": device to host, "in": host to
        device, "copy": within the device), a slice at a time; the bytes moved."""
        step = self.slice_blocks
        for i in range(0, len(src), step):
            slot = self._take()
            part_src, part_dst = src[i : i + step], dst[i : i + step]
            if direction == "out":
                self._out(slot, part_src, part_dst)
            elif direction == "in":
                self._in(slot, part_src, part_dst)
            else:
                self._within(slot, part_src, part_dst)
            if slot.event is not None:
                slot.event.record()
            slot.used = True
            self.slices += 1
        return len(src) * self.block_bytes

    def _take(self) -> _Slot:
        """The next slot, once the slice that last used it has ended."""
        slot = self.slots[self._next]
        self._next = (self._next + 1) % len(self.slots)
        if slot.used and slot.event is not None:
            slot.event.synchronize()  # releases the GIL: the step's thread runs on
        return slot

    def _views(self, slot: _Slot, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(pool-major [L, 2, n, ...] gather view, block-major [n, L, 2, ...] stage view)."""
        count = n * slot.gather.numel() // self.slice_blocks
        layers, kv, *rest = self.block
        gather = slot.gather[:count].view(layers, kv, n, *rest)
        return gather, slot.stage[:count].view(n, *self.block)

    def _out(self, slot: _Slot, src: Sequence[int], dst: Sequence[int]) -> None:
        (idx,) = slot.indices(src)
        gather, stage = self._views(slot, len(src))
        torch.index_select(self.dev, 2, idx, out=gather)
        stage.copy_(gather.permute(2, 0, 1, 3, 4, 5))
        for k, first, n in runs(dst):
            self.host[first : first + n].copy_(stage[k : k + n], non_blocking=True)

    def _in(self, slot: _Slot, src: Sequence[int], dst: Sequence[int]) -> None:
        _, stage = self._views(slot, len(src))
        for k, first, n in runs(src):
            stage[k : k + n].copy_(self.host[first : first + n], non_blocking=True)
        (idx,) = slot.indices(dst)
        self.dev.index_copy_(2, idx, stage.permute(1, 2, 0, 3, 4, 5))

    def _within(self, slot: _Slot, src: Sequence[int], dst: Sequence[int]) -> None:
        idx_src, idx_dst = slot.indices(src, dst)
        gather, _ = self._views(slot, len(src))
        torch.index_select(self.dev, 2, idx_src, out=gather)
        self.dev.index_copy_(2, idx_dst, gather)

    def drain(self) -> None:
        """Wait for every slice queued (before the pools go)."""
        for slot in self.slots:
            if slot.used and slot.event is not None:
                slot.event.synchronize()


def runs(blocks: Sequence[int]) -> list[tuple[int, int, int]]:
    """(position in `blocks`, first block, length) of each run of consecutive blocks.

    Why: a copy between host and device costs a launch and host time; the host pool
    hands out adjacent blocks whenever it can, so most swaps are a few runs.
    """
    out: list[tuple[int, int, int]] = []
    for k, b in enumerate(blocks):
        if out and out[-1][1] + out[-1][2] == b:
            start, first, n = out[-1]
            out[-1] = (start, first, n + 1)
        else:
            out.append((k, b, 1))
    return out
