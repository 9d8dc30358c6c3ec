"""Moves jobs' KV blocks between the device pool and the host pool, for real.

Why a side stream: proactive swapping only pays off if the copies overlap the model
step (paper Fig. 9). On CUDA each batch of copies runs on its own stream after the
compute stream's last writes, and an event marks its end; the engine polls events
between iterations and never waits on them unless it has nothing else to run. On
CPU a single background thread makes the same copies, so tests exercise the same
asynchrony. Synchronous (reactive) copies run before the model step and block.

The host pool is block-major ([num_blocks, layers, 2, block_size, heads, dim]) so a
host block is one contiguous range, pinned on CUDA for asynchronous DMA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from fsd.engine.kv_cache import KVCachePool, KVShape
from fsd.kv.swap import SwapOp


class HostKVPool:
    """The host tier: block-major, pinned when a GPU is present."""

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int, pin: bool) -> None:
        self.shape = shape
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.data = torch.zeros(
            (num_blocks, shape.num_layers, 2, block_size, shape.num_kv_heads, shape.head_dim),
            dtype=shape.dtype,
            pin_memory=pin and num_blocks > 0,
        )

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def bytes_per_block(self) -> int:
        return self.nbytes // max(self.num_blocks, 1)


@dataclass
class _Batch:
    ops: list[SwapOp]
    nbytes: int
    done: Any  # torch.cuda.Event or Future
    keep: list[torch.Tensor] = field(default_factory=list)  # temporaries alive until done


class Swapper:
    """Executes swap plans: `run_sync` on the critical path, `start` + `poll` beside it."""

    def __init__(self, device_pool: KVCachePool, host_pool: HostKVPool) -> None:
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.cuda = device_pool.data.is_cuda
        self._pending: list[_Batch] = []
        self._failed: list[tuple[SwapOp, str]] = []
        self._stream = torch.cuda.Stream(device_pool.data.device) if self.cuda else None
        self._thread = None if self.cuda else ThreadPoolExecutor(1, thread_name_prefix="fsd-swap")
        if self._thread is not None:  # its one thread now: a daemon's thread count is flat
            self._thread.submit(int).result()
        self.bytes_out = 0  # totals, for telemetry
        self.bytes_in = 0

    # ---- copies ----------------------------------------------------------------

    def _copy(self, op: SwapOp, keep: list[torch.Tensor]) -> None:
        dev = self.device_pool.data  # [L, 2, NB, BS, H, D]
        host = self.host_pool.data  # [NB, L, 2, BS, H, D]
        if not op.src:  # every block was cached on the other tier already
            return
        if op.direction == "copy":  # device to device (the prefix cache's copy on write)
            src = torch.tensor(op.src, device=dev.device)
            blocks = dev.index_select(2, src)
            keep.append(blocks)
            dev.index_copy_(2, torch.tensor(op.dst, device=dev.device), blocks)
        elif op.direction == "out":
            src = torch.tensor(op.src, device=dev.device)
            blocks = dev.index_select(2, src).permute(2, 0, 1, 3, 4, 5).contiguous()
            keep.append(blocks)
            for k, d, n in runs(op.dst):  # one copy per run of adjacent host blocks
                host[d : d + n].copy_(blocks[k : k + n], non_blocking=True)
            self.bytes_out += blocks.numel() * blocks.element_size()
        else:
            staged = torch.empty(
                (len(op.src), *host.shape[1:]), dtype=host.dtype, device=dev.device
            )
            for k, s, n in runs(op.src):
                staged[k : k + n].copy_(host[s : s + n], non_blocking=True)
            dst = torch.tensor(op.dst, device=dev.device)
            dev.index_copy_(2, dst, staged.permute(1, 2, 0, 3, 4, 5))
            keep.append(staged)
            self.bytes_in += staged.numel() * staged.element_size()

    def _nbytes(self, ops: Sequence[SwapOp]) -> int:
        return sum(op.num_blocks for op in ops) * self.host_pool.bytes_per_block

    def run_sync(self, ops: Sequence[SwapOp]) -> None:
        """Copy now and wait, in the order given (SchedulerOutput.sync_ops: a later
        copy may write the blocks an earlier one read)."""
        keep: list[torch.Tensor] = []
        for op in ops:
            self._copy(op, keep)
        if self.cuda:
            torch.cuda.current_stream(self.device_pool.data.device).synchronize()

    def start(self, ops: Sequence[SwapOp]) -> Any:
        """Begin asynchronous copies; they end in `poll`. Returns a handle for `order_after`."""
        if not ops:
            return None
        ops = list(ops)
        keep: list[torch.Tensor] = []
        if self.cuda:
            assert self._stream is not None
            self._stream.wait_stream(torch.cuda.current_stream(self.device_pool.data.device))
            with torch.cuda.stream(self._stream):
                for op in ops:
                    self._copy(op, keep)
                event = torch.cuda.Event()
                event.record(self._stream)
            self._pending.append(_Batch(ops, self._nbytes(ops), event, keep))
            return event
        assert self._thread is not None
        future: Future = self._thread.submit(self._copy_all, ops)
        self._pending.append(_Batch(ops, self._nbytes(ops), future))
        return future

    def order_after(self, handle: Any) -> None:
        """Make what runs next on the compute stream wait for one `start`ed batch.

        A pipeline stage starts its micro-batch's copies, receives activations, then
        calls this before its layers read the KV: on CUDA the compute stream waits on
        the copy's event (no host sync); on CPU the copy thread's future is awaited.
        """
        if handle is None:
            return
        if isinstance(handle, Future):
            _raise_if_failed(handle)  # .exception() waits for the copy
        else:
            torch.cuda.current_stream(self.device_pool.data.device).wait_event(handle)

    def _copy_all(self, ops: list[SwapOp]) -> list[tuple[SwapOp, str]]:
        """Each copy on its own: one that fails loses its job's KV, never the others'
        in the batch (they are copied all the same). The failed ones, with why."""
        keep: list[torch.Tensor] = []
        failed: list[tuple[SwapOp, str]] = []
        for op in ops:
            try:
                self._copy(op, keep)
            except Exception as exc:  # noqa: BLE001 - reported for this op's job alone
                failed.append((op, f"a KV copy failed: {type(exc).__name__}: {exc}"))
        return failed

    def poll(self) -> list[SwapOp]:
        """The asynchronous copies that have ended since the last poll.

        A copy that failed has ended too (its blocks' content is lost): it is reported
        here like the others and also listed by `take_failed`, for its job to fail.
        """
        done: list[SwapOp] = []
        still: list[_Batch] = []
        for batch in self._pending:
            if _finished(batch.done):
                self._failed.extend(_failures(batch.done, batch.ops))
                done.extend(batch.ops)
            else:
                still.append(batch)
        self._pending = still
        return done

    def take_failed(self) -> list[tuple[SwapOp, str]]:
        """Copies that failed since the last call, each with why."""
        failed, self._failed = self._failed, []
        return failed

    def wait(self, timeout: float | None = None) -> list[SwapOp]:
        """Block until the oldest pending copy ends (nothing else to do), then poll."""
        if self._pending:
            first = self._pending[0].done
            if isinstance(first, Future):
                with contextlib.suppress(TimeoutError):
                    first.exception(timeout=timeout)
            else:
                first.synchronize()
        return self.poll()

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    @property
    def bytes_in_flight(self) -> int:
        return sum(b.nbytes for b in self._pending)

    def close(self) -> None:
        """Finish the copies in flight, stop the copy thread and let go of both pools
        (their memory returns once the worker drops them too; no copy runs after)."""
        while self._pending:
            self.wait()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
        self.device_pool = self.host_pool = None  # type: ignore[assignment]


def runs(blocks: Sequence[int]) -> list[tuple[int, int, int]]:
    """(position in `blocks`, first block, length) of each run of consecutive blocks.

    Why: a copy between host and device costs a launch (and on a GPU, host time that
    delays the next step); one copy per block made a 512-block swap-out slow the
    decode step beside it 2.7x on an H100 (bench/results/gpu-h100/swap.json). The host
    pool hands out adjacent blocks whenever it can, so most swaps are a few runs.
    """
    out: list[tuple[int, int, int]] = []
    for k, b in enumerate(blocks):
        if out and out[-1][1] + out[-1][2] == b:
            start, first, n = out[-1]
            out[-1] = (start, first, n + 1)
        else:
            out.append((k, b, 1))
    return out


def _finished(done: Any) -> bool:
    return done.done() if isinstance(done, Future) else bool(done.query())


def _failures(done: Any, ops: Sequence[SwapOp]) -> list[tuple[SwapOp, str]]:
    """The copies of a finished batch that failed, with why (a CUDA event has no
    failure to report: a failing CUDA copy raises in `start`)."""
    if not isinstance(done, Future):
        return []
    exc = done.exception()
    if exc is not None:  # the batch itself broke: none of its copies is known good
        return [(op, f"a KV copy failed: {type(exc).__name__}: {exc}") for op in ops]
    return list(done.result())


def _raise_if_failed(done: Any) -> None:
    if isinstance(done, Future):
        exc = done.exception()
        if exc is not None:
            raise RuntimeError(f"a KV copy failed: {exc}") from exc
        if done.result():
            raise RuntimeError(done.result()[0][1])
