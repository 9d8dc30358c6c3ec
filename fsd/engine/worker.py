"""A worker: one tensor-parallel rank of one pipeline stage, and the one step function.

It owns its model shard (its heads and MLP slice of its stage's layers), its device
KV shard ([stage layers, 2, blocks, block_size, kv heads / tp, head_dim]), its host
KV shard, its own swapper and -- on the rank that returns the last stage's result
-- the sampler. Block ids are global: the driver's block manager hands the same plan
to every worker and each moves its own slice of those blocks.

`step(plan, hidden)` is the one model step of the engine: the local executor calls
it in process on a worker that holds the whole model; `fsd.engine.ray_executor`
runs this class as a Ray actor and calls `execute`, which adds the plan's copies
and the hop between stages. On a GPU a decode-only step replays a CUDA graph
(`fsd.engine.cuda_graph`); a CPU worker with no thread count given picks one
(`fsd.engine.threads`). Nothing here imports Ray except `rendezvous` and
`execute` (which fetches the previous stage's activations).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fsd.config import CacheConfig, ModelConfig
from fsd.engine.block_tables import BlockTables
from fsd.engine.cuda_graph import DecodeGraphs
from fsd.engine.kv_cache import KVCachePool, KVShape, num_device_blocks, num_host_blocks
from fsd.engine.plan import StepPlan
from fsd.engine.sampler import Sampler, greedy_tokens
from fsd.engine.stage import StageSpan, build_stage, stage_weights
from fsd.engine.step_tokens import DrawnTokens, StepTokens
from fsd.engine.swapper import HostKVPool, Swapper
from fsd.engine.threads import pick_threads
from fsd.errors import ModelLoadError
from fsd.layers.attention import HostLayout, resolve_backend, upload
from fsd.layers.parallel_state import set_tp_group
from fsd.models.base import CausalLM
from fsd.models.loader import describe_model, param_defaults, resolve_device

log = logging.getLogger("fsd.engine")
# A collective that waits this long means a peer is gone without its socket closing.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


@dataclass(frozen=True)
class WorkerSpec:
    """Where a worker sits: its TP rank of `tp`, its pipeline stage, its device kind."""

    model: ModelConfig
    cache: CacheConfig
    tp: int = 1
    tp_rank: int = 0
    span: StageSpan | None = None  # None: the whole model, one stage
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    threads: int | None = None  # torch intra-op threads; None: fsd.engine.threads decides
    max_batch_size: int = 256  # the largest decode batch a CUDA graph is captured for


class Worker:
    """One model shard with its KV shards, swapper and (last stage, rank 0) sampler."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.device = resolve_device(spec.device)
        if self.device.type == "cpu":
            threads = pick_threads(spec.threads)
            if threads.count is not None:
                torch.set_num_threads(threads.count)
            log.info(threads.log_line(torch.get_num_threads()))
        elif spec.threads is not None:
            torch.set_num_threads(spec.threads)
        self.info = describe_model(spec.model, self.device)
        self.span = spec.span or StageSpan.whole(self.info.arch.num_layers)
        self.model: CausalLM | None = None
        self.pool: KVCachePool | None = None
        self.graphs: DecodeGraphs | None = None  # CUDA graphs of decode steps, when on
        self.swapper: Swapper | None = None
        # only the rank whose result leaves the last stage draws tokens
        self.sampler: Sampler | None = None
        if self.span.last and spec.tp_rank == 0:
            self.sampler = Sampler(spec.model.seed, self.device)
        self._drawn = DrawnTokens()  # the last step's tokens, for a step scheduled ahead
        self._tables = BlockTables()  # for plans that send what changed (table_starts)
        self._store_socket: socket.socket | None = None  # TP rank 0: its group's store

    @property
    def label(self) -> str:
        return f"stage {self.span.index} tp rank {self.spec.tp_rank}"

    # ---- set-up ----------------------------------------------------------------

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port: TP rank 0 hosts its group's store."""
        import ray

        host = ray.util.get_node_ip_address()
        # the group's TCPStore listens on this socket: on the node's address only (a
        # store of its own would bind every interface)
        self._store_socket = socket.create_server((host, 0))
        return host, self._store_socket.getsockname()[1]

    def _join_group(self, master: tuple[str, int] | None) -> None:
        import torch.distributed as dist

        spec = self.spec
        assert master is not None
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        host, port = master
        leader = spec.tp_rank == 0
        listen = self._store_socket.fileno() if leader and self._store_socket else None
        store = dist.TCPStore(
            host, port, spec.tp, leader, timeout=COLLECTIVE_TIMEOUT, master_listen_fd=listen
        )
        dist.init_process_group(
            backend, store=store, rank=spec.tp_rank, world_size=spec.tp, timeout=COLLECTIVE_TIMEOUT
        )

    def setup(self, master: tuple[str, int] | None = None) -> int:
        """Join the stage's TP group (when tp > 1), build and load the shard; weight bytes."""
        spec, info, span = self.spec, self.info, self.span
        if spec.tp > 1:
            self._join_group(master)
        # the parallel layers read the rank when they are built
        set_tp_group(spec.tp_rank, spec.tp)
        with param_defaults(info.dtype, self.device):
            model = build_stage(info.arch, span, spec.model.attn_backend)
        try:
            model.load_weights(stage_weights(info.weights(spec.model.seed, keep=span.holds), span))
        except ModelLoadError as exc:
            if info.checkpoint is None:
                raise
            raise ModelLoadError(f"{info.checkpoint}: {exc}") from None
        model.eval()
        self.model = model
        return sum(p.numel() * p.element_size() for p in model.parameters())

    def kv_shape(self) -> KVShape:
        arch = self.info.arch
        heads = arch.kv_heads_per_rank(self.spec.tp)
        return KVShape(self.span.num_layers, heads, arch.head_dim, self.info.dtype)

    def capacity(self) -> tuple[int, int]:
        """(device, host) blocks this shard's budgets hold; the driver takes the minimum."""
        shape = self.kv_shape()
        cache = self.spec.cache
        return num_device_blocks(cache, shape, self.device), num_host_blocks(cache, shape)

    def allocate(self, device_blocks: int, host_blocks: int) -> int:
        """Create the KV shards; returns the host bytes per block of this shard."""
        shape = self.kv_shape()
        bs = self.spec.cache.block_size
        self.pool = KVCachePool(shape, device_blocks, bs, self.device)
        host = HostKVPool(shape, host_blocks, bs, pin=self.device.type == "cuda")
        self.swapper = Swapper(self.pool, host)
        self.graphs = self._decode_graphs()
        if self.graphs is not None:
            self.graphs.capture_all()  # no client's step pays a compile or a capture
        return shape.bytes_per_block(bs)

    def _decode_graphs(self, capture: Any = None, force: bool = False) -> DecodeGraphs | None:
        """CUDA graphs for decode steps: on a GPU, Triton backend, one TP rank, unless
        turned off (`cuda_graphs = false`). `force` and `capture` let a test run the
        bookkeeping on a CPU with a stand-in capture."""
        spec = self.spec
        backend = resolve_backend(spec.model.attn_backend, self.device)
        wanted = self.device.type == "cuda" and backend == "triton" and spec.tp == 1
        if not force and not (spec.model.cuda_graphs and wanted):
            return None
        assert self.model is not None and self.pool is not None
        model, span, bs = self.model, self.span, self.pool.block_size

        def forward(ids: torch.Tensor, pos: torch.Tensor, hidden: Any, meta: Any) -> Any:
            layers = self.pool.layers  # type: ignore[union-attr]
            out = model.forward_stage(ids, pos, hidden, layers, meta, span.first, span.last)
            if not span.last:
                return out
            logits = model.compute_logits(out)  # the head and the greedy draw in the graph too
            return logits, greedy_tokens(logits)

        return DecodeGraphs(
            forward,
            max_batch_size=spec.max_batch_size,
            max_blocks=-(-self.info.max_model_len // bs),
            block_size=bs,
            hidden_size=self.info.arch.hidden_size,
            dtype=self.info.dtype,
            device=self.device,
            first=span.first,
            capture=capture,
        )

    def ping(self) -> str:
        return f"{self.label} pid {os.getpid()}"

    # ---- one micro-batch -------------------------------------------------------

    def forget(self, job_ids: Iterable[str]) -> None:
        """Drop the sampling state (seeded generators) and block tables of jobs that ended."""
        job_ids = tuple(job_ids)
        self._tables.forget(job_ids)
        if self.sampler is not None:
            for job_id in job_ids:
                self.sampler.forget(job_id)

    @torch.inference_mode()
    def step(self, plan: StepPlan, hidden: torch.Tensor | None = None) -> Any:
        """Run this stage's layers over the plan's batch; sample on the last stage.

        Returns the activations [T, hidden] (not the last stage), one token or
        JobFault per sequence in the plan's order (the last stage's sampling rank;
        None for a prefill chunk short of the end, which draws nothing), or None (the
        last stage's other ranks). Sampling never raises, so an exception from here
        means no row has drawn: the caller may re-run the plan's jobs.
        """
        out = self.launch(plan, hidden)
        return out.values() if isinstance(out, StepTokens) else out

    @torch.inference_mode()
    def launch(self, plan: StepPlan, hidden: torch.Tensor | None = None) -> Any:
        """`step`, returning the last stage's tokens as `StepTokens`: on a GPU the step
        is queued on the device and nothing waits for it until `values` is read."""
        assert self.model is not None and self.pool is not None
        dev, bs = self.device, self.pool.block_size
        if plan.table_starts:  # the tables' changes: the rest is here from earlier steps
            tables, widths = self._tables.update(plan)
            layout = HostLayout.build(plan.query_lens, plan.context_lens, tables, bs, widths)
        else:
            layout = HostLayout.build(plan.query_lens, plan.context_lens, plan.block_tables, bs)
        ids = np.fromiter(plan.input_ids, np.int64, len(plan.input_ids))
        pos = np.fromiter(plan.positions, np.int64, len(plan.positions))
        span, fill = self.span, self._drawn.forward(plan, dev)
        out = None if self.graphs is None else self.graphs.run(layout, ids, pos, hidden, fill)
        if out is not None and span.last:  # a replayed decode step: its logits and argmax
            logits, greedy = out
            rows = [i for i, s in enumerate(plan.samples) if s] if plan.samples else None
            if rows is not None:
                picked = upload(np.asarray(rows, dtype=np.int64), dev)
                logits, greedy = logits[picked], greedy[picked]
            return self._draw(plan, logits, rows, greedy)
        if out is None:  # eagerly: a prefill, graphs off, or no graph
            ids_dev = upload(ids, dev)
            if fill is not None:
                fill(ids_dev)
            out = self.model.forward_stage(
                ids_dev,
                upload(pos, dev),
                hidden,
                self.pool.layers,
                layout.to_device(dev),
                first=span.first,
                last=span.last,
            )
        if not span.last:
            return out
        return self._sample(plan, out, layout.query_start_loc)

    def _sample(self, plan: StepPlan, hidden: torch.Tensor, starts: np.ndarray) -> Any:
        """The head over each sampling row's last position, and its draw.

        A prefill chunk short of the end gets None and no logits, so its seeded
        generator does not advance. Every TP rank runs the head (it all-gathers);
        the plan is the same on each, so they skip the same rows.
        """
        assert self.model is not None
        n = plan.num_seqs
        rows = [i for i, s in enumerate(plan.samples) if s] if plan.samples else list(range(n))
        if not rows:
            self._drawn.keep(plan, None, rows)
            return None if self.sampler is None else StepTokens(None, rows, n)
        last = starts[1:].astype(np.int64) - 1
        if len(rows) < n:
            last = last[rows]
        # every row is one sampled token (a decode batch): the rows are the hidden states
        rows_out = hidden if len(last) == hidden.shape[0] else hidden[upload(last, hidden.device)]
        return self._draw(plan, self.model.compute_logits(rows_out), rows)

    def _draw(
        self,
        plan: StepPlan,
        logits: torch.Tensor,
        rows: list[int] | None = None,
        greedy: torch.Tensor | None = None,
    ) -> Any:
        """The tokens of the sampling `rows` (all when None) from their logits (and their
        argmax, when the graph drew it)."""
        n = plan.num_seqs
        if self.sampler is None:
            return None
        if rows is None or len(rows) == n:
            drawn = self.sampler.draw(logits, plan.params, plan.job_ids, plan.banned, greedy)
            rows = None
        else:
            pick = [plan.banned[i] for i in rows] if plan.banned else ()
            drawn = self.sampler.draw(
                logits, [plan.params[i] for i in rows], [plan.job_ids[i] for i in rows], pick
            )
        self._drawn.keep(plan, drawn, rows)
        return StepTokens(drawn, rows, n)

    @torch.inference_mode()
    def execute(self, plan: StepPlan, prev: list[Any] | None) -> tuple[str, Any]:
        """Swap this shard's blocks, run the stage; (status, what the next hop needs).

        `prev` holds the previous stage's output as an unresolved Ray reference, so
        the copies start first and overlap receiving the activations. The driver
        waits on the small status of every worker; the payload -- activations, or
        the last stage's tokens, from TP rank 0 (None elsewhere) -- goes to the next
        stage without passing through the driver. Every copy of the plan has ended
        on return.
        """
        assert self.swapper is not None
        self.forget(plan.forget)
        swapper = self.swapper
        sync = swapper.start([s.as_op(True) for s in plan.sync_swaps])
        swapper.start([s.as_op(False) for s in plan.async_swaps])
        hidden = None
        if prev:
            import ray

            hidden = ray.get(prev[0])
            if hidden is not None:
                hidden = hidden.to(self.device)
        out = None
        if plan.has_model_step:
            swapper.order_after(sync)  # the layers must see the swapped-in KV
            out = self.step(plan, hidden)
            if self.spec.tp_rank != 0:
                out = None  # rank 0 speaks for the stage
            elif isinstance(out, torch.Tensor):
                out = out.cpu()  # activations travel through Ray's object store
        while swapper.busy:  # a copy's end is reported with its micro-batch
            swapper.wait()
        return self.label, out

    def shutdown(self) -> None:
        """Stop the copy threads and give the weights' and KV's memory back: a second
        engine in the same process sizes its KV from what is free (on a GPU, torch's
        allocator keeps freed blocks until emptied, so it is emptied here)."""
        if self.swapper is not None:
            self.swapper.close()
        self.model = self.pool = self.graphs = self.swapper = None
        if self.device.type == "cuda":
            import gc

            gc.collect()  # the model's modules hold reference cycles
            torch.cuda.empty_cache()
        if self.spec.tp > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
