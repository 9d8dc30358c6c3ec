"""Moves jobs' KV blocks between the device pool and the host pool, for real.

Why a copier thread and a side stream: proactive swapping only pays off if the
copies overlap the model step (paper Fig. 9). One thread makes every asynchronous
copy, a bounded slice at a time (`fsd.engine.swap_staging`: why slices); on CUDA on
its own stream, after the compute stream's writes as of `start` (an event), and an
event marks each batch's end. The engine polls between iterations and never waits
unless it has nothing else to run. On CPU the same thread makes the same slices, so
tests exercise the same asynchrony. Synchronous (reactive) copies run on the compute
stream before the model step and block.

The host pool is block-major ([num_blocks, layers, 2, block_size, heads, dim]) so a
host block is one contiguous range, pinned on CUDA for asynchronous DMA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from fsd.engine.kv_cache import KVCachePool, KVShape
from fsd.engine.swap_staging import Staging, runs
from fsd.errors import ConfigError
from fsd.kv.swap import SwapOp

__all__ = ["HostKVPool", "Swapper", "runs"]


class HostKVPool:
    """The host tier: block-major, pinned when a GPU is present."""

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int, pin: bool) -> None:
        self.shape = shape
        self.num_blocks = num_blocks
        self.block_size = block_size
        size = (num_blocks, shape.num_layers, 2, block_size, shape.num_kv_heads, shape.head_dim)
        try:
            self.data = torch.zeros(size, dtype=shape.dtype, pin_memory=pin and num_blocks > 0)
        except RuntimeError as exc:  # pinning is page-locking: the host may refuse it
            need = num_blocks * shape.bytes_per_block(block_size) / (1 << 30)
            raise ConfigError(
                f"the host KV pool needs {need:.1f} GiB of {'pinned ' if pin else ''}host memory "
                f"({num_blocks} blocks) and could not get it ({exc}); lower host_kv_bytes or "
                "num_host_blocks"
            ) from exc

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
    done: Future  # the copier's: its failures and, on CUDA, the event of its last slice


class Swapper:
    """Executes swap plans: `run_sync` on the critical path, `start` + `poll` beside it."""

    def __init__(
        self, device_pool: KVCachePool, host_pool: HostKVPool, slice_bytes: int | None = None
    ) -> None:
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.cuda = device_pool.data.is_cuda
        self._pending: list[_Batch] = []
        self._failed: list[tuple[SwapOp, str]] = []
        device = device_pool.data.device
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        self.staging = Staging(device_pool.data, host_pool.data, slice_bytes)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="fsd-swap")
        # its one thread now (a daemon's thread count is flat), on the pool's device
        self._thread.submit(torch.cuda.set_device if self.cuda else str, device).result()
        self.bytes_out = 0  # totals, for telemetry
        self.bytes_in = 0

    # ---- copies ----------------------------------------------------------------

    def _copy(self, op: SwapOp, staging: Staging | None) -> None:
        """One op: a slice at a time through `staging` (the copier), or at once on the
        current stream (a synchronous copy: it blocks the step anyway)."""
        if not op.src:  # every block was cached on the other tier already
            return
        if staging is not None:
            moved = staging.copy(op.direction, op.src, op.dst)
        else:
            moved = _copy_at_once(self.device_pool.data, self.host_pool.data, op)
        if op.direction == "out":
            self.bytes_out += moved
        elif op.direction == "in":
            self.bytes_in += moved

    def _nbytes(self, ops: Sequence[SwapOp]) -> int:
        return sum(op.num_blocks for op in ops) * self.host_pool.bytes_per_block

    def run_sync(self, ops: Sequence[SwapOp]) -> None:
        """Copy now and wait, in the order given (SchedulerOutput.sync_ops: a later
        copy may write the blocks an earlier one read)."""
        for op in ops:
            self._copy(op, None)
        if self.cuda:
            torch.cuda.current_stream(self.device_pool.data.device).synchronize()

    def start(self, ops: Sequence[SwapOp]) -> Any:
        """Begin asynchronous copies; they end in `poll`. Returns a handle for `order_after`."""
        if not ops:
            return None
        ops = list(ops)
        ready = None
        if self.cuda:  # the copies read the KV as the compute stream has written it so far
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device_pool.data.device))
        future: Future = self._thread.submit(self._copy_all, ops, ready)
        self._pending.append(_Batch(ops, self._nbytes(ops), future))
        return future

    def order_after(self, handle: Any) -> None:
        """Make what runs next on the compute stream wait for one `start`ed batch.

        A pipeline stage starts its micro-batch's copies, receives activations, then
        calls this before its layers read the KV: the copier's future is awaited (it
        has queued every slice), then on CUDA the compute stream waits on the batch's
        last event (no host sync for the copies themselves).
        """
        if handle is None:
            return
        _raise_if_failed(handle)  # .exception() waits for the copier
        end = handle.result()[1]
        if end is not None:
            torch.cuda.current_stream(self.device_pool.data.device).wait_event(end)

    def _copy_all(self, ops: list[SwapOp], ready: Any) -> tuple[list[tuple[SwapOp, str]], Any]:
        """Each copy on its own: one that fails loses its job's KV, never the others'
        in the batch (they are copied all the same). The failed ones, with why, and on
        CUDA the event that ends the batch."""
        failed: list[tuple[SwapOp, str]] = []
        with contextlib.ExitStack() as stack:
            if self._stream is not None:
                stack.enter_context(torch.cuda.stream(self._stream))
                self._stream.wait_event(ready)
            for op in ops:
                try:
                    self._copy(op, self.staging)
                except Exception as exc:  # noqa: BLE001 - reported for this op's job alone
                    failed.append((op, f"a KV copy failed: {type(exc).__name__}: {exc}"))
            end = None
            if self._stream is not None:
                end = torch.cuda.Event()
                end.record(self._stream)
        return failed, end

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
            with contextlib.suppress(TimeoutError):
                if first.exception(timeout=timeout) is None and first.result()[1] is not None:
                    first.result()[1].synchronize()
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
        self._thread.shutdown(wait=True)
        if self.staging is not None:  # (a second close finds it gone)
            self.staging.drain()
            self.staging = None  # type: ignore[assignment]  # it holds both pools' tensors
        self.device_pool = self.host_pool = None  # type: ignore[assignment]


def _copy_at_once(dev: torch.Tensor, host: torch.Tensor, op: SwapOp) -> int:
    """A copy on the current stream, waited for by the caller (temporaries allocated
    and kept alive until then by the stream's allocator); bytes moved.
    `dev` is [L, 2, NB, BS, H, D], `host` [NB, L, 2, BS, H, D]."""
    if op.direction == "copy":  # device to device (the prefix cache's copy on write)
        blocks = dev.index_select(2, torch.tensor(op.src, device=dev.device))
        dev.index_copy_(2, torch.tensor(op.dst, device=dev.device), blocks)
    elif op.direction == "out":
        blocks = dev.index_select(2, torch.tensor(op.src, device=dev.device))
        blocks = blocks.permute(2, 0, 1, 3, 4, 5).contiguous()
        for k, d, n in runs(op.dst):  # one copy per run of adjacent host blocks
            host[d : d + n].copy_(blocks[k : k + n], non_blocking=True)
    else:
        blocks = torch.empty((len(op.src), *host.shape[1:]), dtype=host.dtype, device=dev.device)
        for k, s, n in runs(op.src):
            blocks[k : k + n].copy_(host[s : s + n], non_blocking=True)
        dev.index_copy_(2, torch.tensor(op.dst, device=dev.device), blocks.permute(1, 2, 0, 3, 4, 5))
    return blocks.numel() * blocks.element_size()


def _finished(done: Future) -> bool:
    """The copier has queued the batch and (on CUDA) its last slice has ended."""
    if not done.done():
        return False
    if done.exception() is not None:
        return True
    end = done.result()[1]
    return end is None or bool(end.query())


def _failures(done: Future, ops: Sequence[SwapOp]) -> list[tuple[SwapOp, str]]:
    """The copies of a finished batch that failed, with why."""
    exc = done.exception()
    if exc is not None:  # the batch itself broke: none of its copies is known good
        return [(op, f"a KV copy failed: {type(exc).__name__}: {exc}") for op in ops]
    return list(done.result()[0])


def _raise_if_failed(done: Future) -> None:
    exc = done.exception()
    if exc is not None:
        raise RuntimeError(f"a KV copy failed: {exc}") from exc
    if done.result()[0]:
        raise RuntimeError(done.result()[0][0][1])
