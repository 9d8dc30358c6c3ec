"""A distributed worker: one tensor-parallel rank of one pipeline stage.

It owns its model shard (its heads and MLP slice of its stage's layers), its device
KV shard ([stage layers, 2, blocks, block_size, kv heads / tp, head_dim]), its host
KV shard and its own swapper. Block ids are global: the driver's block manager
hands the same plan to every worker and each moves its own slice of those blocks.

`fsd.engine.ray_executor` runs this class as a Ray actor; nothing here imports Ray
except `execute`, which fetches the previous stage's activations.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch

from fsd.config import CacheConfig, ModelConfig
from fsd.engine.kv_cache import KVCachePool, KVShape, num_device_blocks, num_host_blocks
from fsd.engine.plan import StepPlan
from fsd.engine.sampler import greedy_tokens
from fsd.engine.stage import StageModel, StageSpan, build_stage, stage_weights
from fsd.engine.swapper import HostKVPool, Swapper
from fsd.layers.attention import AttentionMetadata
from fsd.layers.parallel_state import set_tp_group
from fsd.models.loader import describe_model, param_defaults, resolve_device

# A collective that waits this long means a peer is gone without its socket closing.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


@dataclass(frozen=True)
class WorkerSpec:
    """Where a worker sits: its TP rank of `tp`, its pipeline stage, its device kind."""

    model: ModelConfig
    cache: CacheConfig
    tp: int
    tp_rank: int
    span: StageSpan
    device: str  # "cpu" | "cuda"
    threads: int  # torch intra-op threads (CPU actors share the cores)

    @property
    def label(self) -> str:
        return f"stage {self.span.index} tp rank {self.tp_rank}"


class Worker:
    """One model shard with its KV shards and swapper; runs step plans."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        torch.set_num_threads(max(1, spec.threads))
        self.device = resolve_device(spec.device)
        self.info = describe_model(spec.model, self.device)
        self.stage: StageModel | None = None
        self.pool: KVCachePool | None = None
        self.swapper: Swapper | None = None
        self._store_socket: socket.socket | None = None  # TP rank 0: its group's store

    # ---- set-up ----------------------------------------------------------------

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port: TP rank 0 hosts its group's store."""
        import ray

        host = ray.util.get_node_ip_address()
        # the group's TCPStore listens on this socket: on the node's address only (a
        # store of its own would bind every interface)
        self._store_socket = socket.create_server((host, 0))
        return host, self._store_socket.getsockname()[1]

    def setup(self, master: tuple[str, int] | None) -> int:
        """Join the stage's TP group (when tp > 1), build and load the shard; weight bytes."""
        spec = self.spec
        if spec.tp > 1:
            import torch.distributed as dist

            assert master is not None
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            host, port = master
            leader = spec.tp_rank == 0
            store = dist.TCPStore(
                host,
                port,
                spec.tp,
                leader,
                timeout=COLLECTIVE_TIMEOUT,
                master_listen_fd=self._store_socket.fileno()
                if leader and self._store_socket is not None
                else None,
            )
            dist.init_process_group(
                backend,
                store=store,
                rank=spec.tp_rank,
                world_size=spec.tp,
                timeout=COLLECTIVE_TIMEOUT,
            )
        # the parallel layers read the rank when they are built
        set_tp_group(spec.tp_rank, spec.tp)
        info = self.info
        with param_defaults(info.dtype, self.device):
            model = build_stage(info.arch, spec.span, spec.model.attn_backend)
        weights = info.weights(spec.model.seed, keep=spec.span.holds)
        model.load_weights(stage_weights(weights, spec.span))
        model.eval()
        self.stage = StageModel(model, spec.span)
        return sum(p.numel() * p.element_size() for p in model.parameters())

    def kv_shape(self) -> KVShape:
        arch = self.info.arch
        heads = arch.kv_heads_per_rank(self.spec.tp)
        return KVShape(self.spec.span.num_layers, heads, arch.head_dim, self.info.dtype)

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
        return shape.bytes_per_block(bs)

    def ping(self) -> str:
        return f"{self.spec.label} pid {os.getpid()}"

    # ---- one micro-batch -------------------------------------------------------

    @torch.inference_mode()
    def execute(self, plan: StepPlan, prev: list[Any] | None) -> tuple[str, Any]:
        """Swap this shard's blocks, run the stage; (status, what the next hop needs).

        `prev` holds the previous stage's output as an unresolved Ray reference, so
        the copies start first and overlap receiving the activations. The driver
        waits on the small status of every worker; the payload -- activations, or
        the last stage's tokens / logits, from TP rank 0 (None elsewhere) -- goes to
        the next stage without passing through the driver. Every copy of the plan
        has ended on return.
        """
        assert self.stage is not None and self.pool is not None and self.swapper is not None
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
            out = self._forward(plan, hidden)
        while swapper.busy:  # a copy's end is reported with its micro-batch
            swapper.wait()
        return self.spec.label, (out if self.spec.tp_rank == 0 else None)

    def _forward(self, plan: StepPlan, hidden: torch.Tensor | None) -> Any:
        assert self.stage is not None and self.pool is not None
        dev = self.device
        meta = AttentionMetadata.build(
            query_lens=plan.query_lens,
            context_lens=plan.context_lens,
            block_tables=plan.block_tables,
            block_size=self.pool.block_size,
            device=dev,
        )
        ids = torch.tensor(plan.input_ids, dtype=torch.long, device=dev)
        pos = torch.tensor(plan.positions, dtype=torch.long, device=dev)
        hidden = self.stage.forward(ids, pos, hidden, self.pool.layers, meta)
        if not self.spec.span.last:
            return hidden.cpu() if self.spec.tp_rank == 0 else None
        last = (meta.query_start_loc[1:] - 1).long()
        logits = self.stage.compute_logits(hidden[last])  # all ranks: the head all-gathers
        if plan.banned is None:
            return logits.cpu()
        # every row greedy: ban, argmax -- exactly Sampler.sample's greedy path (NaN-safe)
        for i, ids_banned in enumerate(plan.banned):
            if ids_banned:
                logits[i, list(ids_banned)] = float("-inf")
        return greedy_tokens(logits).tolist()

    def shutdown(self) -> None:
        if self.swapper is not None:
            self.swapper.close()
        if self.spec.tp > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
