"""Executors: where a micro-batch (a batch plus its swap plan) runs.

The engine keeps the scheduler, the block manager and the jobs; an executor owns the
model and the KV tensors. `LocalExecutor` is the single-device path, in process;
`fsd.engine.ray_executor.RayExecutor` runs tensor x pipeline parallel shards on Ray
actors. `make_executor` picks one and never imports Ray for tp = pp = 1.

Protocol, per micro-batch: `submit(batch, sync_ops, async_ops)` returns a ticket;
`result(ticket, timeout)` gives one sampled token per job (batch order) once the
micro-batch has left the last stage, or None while it is still in flight. Up to
`max_in_flight` micro-batches may be submitted before the oldest is collected
(pipeline parallelism fills the stages). Asynchronous copies end either through
`swapper.poll()` (local: they may outlive a step) or with their micro-batch
(`StepResult.swaps_done`, distributed: each stage waits for its share).
A dead worker surfaces as `WorkerFailure` from `result`. A job whose step failed on
its own gets a `JobFault` in place of its token; the other jobs get theirs.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fsd.config import EngineConfig
from fsd.engine.kv_cache import KVCachePool, KVShape, num_device_blocks, num_host_blocks
from fsd.engine.model_runner import ModelRunner
from fsd.engine.output import JobFault, describe
from fsd.engine.sampler import Sampler
from fsd.engine.swapper import HostKVPool, Swapper
from fsd.errors import FsdError
from fsd.jobs import Job
from fsd.kv.swap import SwapOp
from fsd.models.loader import load_model

log = logging.getLogger("fsd.engine")


class WorkerFailure(FsdError):
    """A worker died or failed mid-step; the micro-batches in flight are lost."""


@dataclass
class StepResult:
    """What one micro-batch produced: a token per job (batch order) and copies that ended.

    A job whose step failed on its own has a JobFault in place of its token.
    """

    tokens: list[int | JobFault]
    swaps_done: list[SwapOp] = field(default_factory=list)


class Executor(abc.ABC):
    """Runs micro-batches on the model, wherever its shards live.

    Attributes the engine reads: `loaded` (arch, tokenizer, dtype, device, source,
    max_model_len, weight_bytes), `num_device_blocks` / `num_host_blocks` (the block
    manager's sizes), `sampler`, `runner` (execute(jobs) -> tokens, for the profiler),
    `swapper` (poll / wait / busy / byte counters / close).
    """

    loaded: Any
    num_device_blocks: int
    num_host_blocks: int
    sampler: Sampler
    runner: Any
    swapper: Any
    max_in_flight: int = 1
    # True when a micro-batch's asynchronous copies end with its result
    # (StepResult.swaps_done); False when they end through swapper.poll(). The engine
    # reads it to account the copies of a micro-batch whose result was lost.
    copies_end_with_result: bool = True

    @abc.abstractmethod
    def submit(
        self, batch: Sequence[Job], sync_ops: Sequence[SwapOp], async_ops: Sequence[SwapOp]
    ) -> int:
        """Start a micro-batch; `batch` may be empty (copies only). Returns its ticket."""

    @abc.abstractmethod
    def result(self, ticket: int, timeout: float | None = None) -> StepResult | None:
        """The micro-batch's tokens, waiting up to `timeout` (None: until done)."""

    def restart(self) -> None:
        """Replace failed workers (weights reloaded, KV empty); raise when impossible."""
        raise WorkerFailure("this executor cannot restart its workers")

    def close(self) -> None:
        """Release workers and copy threads."""
        self.swapper.close()


class LocalExecutor(Executor):
    """The model in this process on one device: today's single-device path, unchanged."""

    copies_end_with_result = False

    def __init__(self, config: EngineConfig) -> None:
        self.loaded = load_model(config.model)
        self.device = self.loaded.device
        arch = self.loaded.arch
        shape = KVShape(arch.num_layers, arch.num_kv_heads, arch.head_dim, self.loaded.dtype)
        self.num_device_blocks = num_device_blocks(config.cache, shape, self.device)
        self.num_host_blocks = num_host_blocks(config.cache, shape)
        block_size = config.cache.block_size
        self.pool = KVCachePool(shape, self.num_device_blocks, block_size, self.device)
        self.host_pool = HostKVPool(
            shape, self.num_host_blocks, block_size, pin=self.device.type == "cuda"
        )
        self.swapper = Swapper(self.pool, self.host_pool)
        self.sampler = Sampler(config.model.seed, self.device)
        eos_ids = frozenset(self.loaded.tokenizer.eos_token_ids)
        self.runner = ModelRunner(self.loaded.model, self.pool, self.sampler, self.device, eos_ids)
        self._results: dict[int, StepResult] = {}
        self._seq = 0

    def submit(
        self, batch: Sequence[Job], sync_ops: Sequence[SwapOp], async_ops: Sequence[SwapOp]
    ) -> int:
        # sync copies block before the step; async ones overlap it (side stream / thread)
        self.swapper.run_sync(sync_ops)
        self.swapper.start(list(async_ops))
        self._seq += 1
        tokens = self._execute(list(batch)) if batch else []
        self._results[self._seq] = StepResult(tokens)
        return self._seq

    def _execute(self, batch: list[Job], whole: bool = True) -> list[int | JobFault]:
        """The model step over `batch`, with a job that fails on its own isolated.

        If the step over the whole batch raises, the halves are re-run, recursively,
        until each failing part is a single job: that job gets a JobFault, every
        other job its token (k culprits cost about 2k log n extra steps; a failure
        that needs several jobs together, such as running out of memory, ends with
        every job served by smaller steps). Re-running is safe: a step rewrites the
        same KV slots and changes no job; and the runner never raises once sampling
        has begun (a sampling fault is a JobFault row), so an exception means no job
        has drawn: a seeded job's generator advances exactly once, in the step that
        returns its token.
        """
        try:
            return self.runner.execute(batch)
        except WorkerFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - isolated below, reported per job
            if len(batch) == 1:
                return [JobFault.of("the model step", exc)]
            if whole:
                log.warning(
                    "%s; re-running its %d jobs in halves to find the failing ones",
                    describe("the model step", exc),
                    len(batch),
                )
        mid = len(batch) // 2
        return self._execute(batch[:mid], False) + self._execute(batch[mid:], False)

    def result(self, ticket: int, timeout: float | None = None) -> StepResult | None:
        return self._results.pop(ticket)


def make_executor(config: EngineConfig) -> Executor:
    """Local for tp = pp = 1; Ray actors otherwise (Ray is imported only then)."""
    par = config.parallel
    if par.tp * par.pp == 1 and par.ray_address is None:
        return LocalExecutor(config)
    from fsd.engine.ray_executor import RayExecutor

    return RayExecutor(config)
