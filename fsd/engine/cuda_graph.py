"""Decode steps replayed as CUDA graphs, one graph per batch-size bucket.

A decode step of a small batch is mostly kernel launches: a few per layer, each
costing the host more than the GPU spends on it. Capturing the step once as a CUDA
graph (on the last stage with the head: the graph's output is the logits and their
greedy tokens) and
replaying it launches the whole step at once (as nano-vllm's model runner
and vLLM do). A graph replays fixed tensors, so the step's inputs -- token ids,
positions, slot mapping, block tables, context lengths (and, on a later pipeline
stage, the activations) -- live in static buffers sized for the largest bucket; a
batch of n decodes is copied into the first n rows and runs the graph of the
smallest bucket >= n, its padding rows writing no K/V (slot -1) and reading one
token. Buckets are 1, 2, 4, then every multiple of 8 up to the largest batch.

Only pure-decode iterations replay; a step with a prefill runs eagerly. Every
bucket is captured at start (`capture_all`, logged with its progress), so no step a
client waits on pays a compile or a capture: the step runs once eagerly on the
static buffers (Triton compiles, cuBLAS settles), then is captured into a memory
pool that all buckets share (they never run at once). Capture needs code that never
syncs with the host, which the Triton backend is; if a capture fails anyway, fsd
logs one warning and runs every step eagerly from then on; if it fails for want of
memory, the start fails and says so. `cuda_graphs = false` in [model] turns graphs
off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fsd.engine.output import describe
from fsd.errors import ConfigError
from fsd.layers.attention import AttentionMetadata, HostLayout

log = logging.getLogger("fsd.engine")

# (replay, static output) of one captured step; `capture(run)` makes it from a step
# function that reads the static buffers and returns its output tensor
Replay = tuple[Callable[[], None], Any]  # the output: a tensor or a tuple of tensors
Capture = Callable[[Callable[[], torch.Tensor]], Replay]

MAX_CAPTURE_BATCH = 512  # larger decode batches run eagerly (launches are amortised)


def graph_buckets(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, 24, ... up to max_batch_size (itself the last bucket)."""
    top = max(1, min(max_batch_size, MAX_CAPTURE_BATCH))
    sizes = {b for b in (1, 2, 4) if b < top} | set(range(8, top, 8)) | {top}
    return tuple(sorted(sizes))


class CudaCapture:
    """Captures into one CUDA graph memory pool shared by every bucket."""

    def __init__(self) -> None:
        self.pool: Any = None

    def __call__(self, run: Callable[[], torch.Tensor]) -> Replay:
        run()  # warm up outside the graph: compiles kernels, settles library workspaces
        torch.cuda.synchronize()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the swapper's copy thread may use CUDA while this captures
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = run()
        return graph.replay, out


class DecodeGraphs:
    """Static buffers and the captured decode steps of one worker's model shard.

    `run(layout, ids, positions, hidden)` returns the stage's output rows (views of the
    graph's static output, valid until the next replay: [n, hidden], or on the last
    stage the logits [n, vocab] and greedy tokens [n]), or None when
    the step must run eagerly: it carries a prefill, or graphs are off after a failed
    capture.
    """

    def __init__(
        self,
        forward: Callable[..., torch.Tensor],
        *,
        max_batch_size: int,
        max_blocks: int,
        block_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        first: bool = True,
        capture: Capture | None = None,
    ) -> None:
        """`forward(ids, positions, hidden, meta)`: the stage's model step."""
        self.forward = forward
        self.buckets = graph_buckets(max_batch_size)
        self.block_size = block_size
        self.max_blocks = max(1, max_blocks)
        self.capture = capture or CudaCapture()
        self.failed: str | None = None  # why graphs are off, after a failed capture
        self._graphs: dict[int, Replay] = {}
        top = self.buckets[-1]
        i32, i64 = torch.int32, torch.int64
        self.input_ids = torch.zeros(top, dtype=i64, device=device)
        self.positions = torch.zeros(top, dtype=i64, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=i64, device=device)
        self.block_tables = torch.zeros((top, self.max_blocks), dtype=i32, device=device)
        self.context_lens = torch.ones(top, dtype=i32, device=device)
        self.query_start_loc = torch.arange(top + 1, dtype=i32, device=device)
        self.hidden = None if first else torch.zeros(top, hidden_size, dtype=dtype, device=device)

    @property
    def captured(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def bucket(self, layout: HostLayout) -> int | None:
        """The bucket that replays this step, or None to run it eagerly."""
        n = layout.context_lens.shape[0]
        if self.failed is not None or n == 0 or layout.num_decodes != n:
            return None
        if -(-layout.max_context_len // self.block_size) > self.max_blocks:
            return None
        return next((b for b in self.buckets if b >= n), None)

    def run(
        self,
        layout: HostLayout,
        input_ids: np.ndarray,
        positions: np.ndarray,
        hidden: torch.Tensor | None = None,
        fill: Callable[[torch.Tensor], None] | None = None,
    ) -> torch.Tensor | None:
        """Replay the step's bucket (captured now if it is not yet); None: no bucket
        fits. `fill` writes the inputs the previous step drew into the input ids."""
        bucket = self.bucket(layout)
        if bucket is None:
            return None
        n = layout.context_lens.shape[0]
        self._load(layout, input_ids, positions, hidden, bucket)
        if fill is not None:
            fill(self.input_ids[:n])
        graph = self._graphs.get(bucket)
        if graph is None:
            try:
                graph = self.capture(lambda: self._step(bucket))
            except Exception as exc:  # noqa: BLE001 - eager still works: say so once
                self.failed = describe("capturing a CUDA graph", exc)
                self._graphs.clear()
                log.warning("%s; decode steps run eagerly from now on", self.failed)
                return None
            self._graphs[bucket] = graph
        replay, out = graph
        replay()
        return out[:n] if isinstance(out, torch.Tensor) else tuple(t[:n] for t in out)

    def capture_all(self, every: float = 2.0) -> None:
        """Capture every bucket now, on padding rows (they write no KV), logging the
        progress at most every `every` seconds. Out of memory: ConfigError, saying
        what to lower; any other failure: graphs off (one warning), steps run eagerly."""
        began = last = time.monotonic()
        log.info("capturing %d CUDA graphs of decode steps (batch %d to %d)",
                 len(self.buckets), self.buckets[0], self.buckets[-1])  # fmt: skip
        for k, bucket in enumerate(self.buckets):
            if bucket in self._graphs:
                continue
            self.slot_mapping[:bucket].fill_(-1)
            self.context_lens[:bucket].fill_(1)
            try:
                self._graphs[bucket] = self.capture(lambda b=bucket: self._step(b))
            except torch.OutOfMemoryError as exc:
                self._graphs.clear()
                raise ConfigError(
                    f"capturing the CUDA graph of a decode batch of {bucket} ran out of GPU memory "
                    f"({exc}); lower max_batch_size or gpu_memory_utilization, or set "
                    "cuda_graphs = false"
                ) from exc
            except Exception as exc:  # noqa: BLE001 - eager still works: say so once
                self.failed = describe("capturing a CUDA graph", exc)
                self._graphs.clear()
                log.warning("%s; decode steps run eagerly from now on", self.failed)
                return
            if time.monotonic() - last >= every:
                last = time.monotonic()
                log.info("captured %d/%d CUDA graphs (%.0f s)", k + 1, len(self.buckets), last - began)
        log.info("captured %d CUDA graphs in %.1f s", len(self.buckets), time.monotonic() - began)

    def _step(self, bucket: int) -> torch.Tensor:
        """The model step over the first `bucket` rows of the static buffers."""
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            block_tables=self.block_tables[:bucket],
            context_lens=self.context_lens[:bucket],
            query_start_loc=self.query_start_loc[: bucket + 1],
            num_decodes=bucket,
            max_query_len=1,
            max_context_len=self.max_blocks * self.block_size,
        )
        hidden = None if self.hidden is None else self.hidden[:bucket]
        return self.forward(self.input_ids[:bucket], self.positions[:bucket], hidden, meta)

    def _load(
        self,
        layout: HostLayout,
        input_ids: np.ndarray,
        positions: np.ndarray,
        hidden: torch.Tensor | None,
        bucket: int,
    ) -> None:
        """This step's inputs into the static rows; the padding rows write nothing."""
        n = layout.context_lens.shape[0]
        width = min(layout.block_tables.shape[1], self.max_blocks)
        _fill(self.input_ids[:n], input_ids)
        _fill(self.positions[:n], positions)
        _fill(self.slot_mapping[:n], layout.slot_mapping)
        _fill(self.context_lens[:n], layout.context_lens)
        # columns past a row's context are never read: only the used ones are copied
        _fill(self.block_tables[:n, :width], np.ascontiguousarray(layout.block_tables[:, :width]))
        if bucket > n:
            self.slot_mapping[n:bucket].fill_(-1)
            self.context_lens[n:bucket].fill_(1)
        if self.hidden is not None:
            if hidden is None:
                raise ValueError("a later pipeline stage needs the previous stage's activations")
            self.hidden[:n].copy_(hidden, non_blocking=True)


def _fill(dst: torch.Tensor, array: np.ndarray) -> None:
    """Copy a host array into a static buffer (from pinned memory on a GPU, not blocking)."""
    src = torch.from_numpy(array)
    if dst.is_cuda:
        src = src.pin_memory()
    dst.copy_(src, non_blocking=dst.is_cuda)
