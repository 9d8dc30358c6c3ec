"""Executors: where a micro-batch (a batch plus its swap plan) runs.

The engine keeps the scheduler, the block manager and the jobs; an executor owns
the workers, which hold the model and the KV tensors. Both executors lay a batch
out as the same `StepPlan` and run the same `Worker.step` over it:
`LocalExecutor` on one in-process worker that holds the whole model;
`fsd.engine.ray_executor.RayExecutor` on tensor x pipeline parallel workers as Ray
actors. `executor_factory.make_executor` picks one and never imports Ray for
tp = pp = 1.

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
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from fsd.config import EngineConfig
from fsd.engine.output import JobFault, describe
from fsd.engine.plan import StepPlan, TableMirror, build_plan, sub_plan, unorder
from fsd.engine.worker import Worker, WorkerSpec
from fsd.errors import FsdError
from fsd.jobs import Job
from fsd.kv.swap import SwapOp
from fsd.models.arch import ModelArch
from fsd.tokenizer import Tokenizer

log = logging.getLogger("fsd.engine")


class WorkerFailure(FsdError):
    """A worker died or failed mid-step; the micro-batches in flight are lost."""


@dataclass
class StepResult:
    """What one micro-batch produced: a token per job (batch order) and copies that ended.

    A job whose step failed on its own has a JobFault in place of its token.
    """

    tokens: list[int | JobFault | None]  # None: a prefill chunk that drew nothing
    swaps_done: list[SwapOp] = field(default_factory=list)


@dataclass
class ModelSummary:
    """What the engine knows of its model, wherever the weights live."""

    arch: ModelArch
    tokenizer: Tokenizer
    dtype: torch.dtype
    device: torch.device  # where this process times steps: the model's, or the CPU (Ray)
    max_model_len: int
    source: str  # "preset:<name>" or the checkpoint directory
    weight_bytes: int = 0  # every shard together


class Executor(abc.ABC):
    """Runs micro-batches on the model, wherever its shards live.

    Attributes the engine reads: `loaded` (a ModelSummary), `num_device_blocks` /
    `num_host_blocks` (the block manager's sizes), `eos_ids` (banned before a job's
    min_tokens), `swapper` (poll / wait / busy / byte counters / close).
    """

    loaded: ModelSummary
    num_device_blocks: int
    num_host_blocks: int
    eos_ids: tuple[int, ...]
    swapper: Any
    max_in_flight: int = 1
    # True when a micro-batch's asynchronous copies end with its result
    # (StepResult.swaps_done); False when they end through swapper.poll(). The engine
    # reads it to account the copies of a micro-batch whose result was lost.
    copies_end_with_result: bool = True
    healthy: bool = True  # the workers now running have completed a micro-batch
    tables: TableMirror | None = None  # set: plans send block tables' changes only

    def plan(
        self,
        seq: int,
        batch: Sequence[Job],
        sync_ops: Sequence[SwapOp] = (),
        async_ops: Sequence[SwapOp] = (),
        forget: Sequence[str] = (),
    ) -> StepPlan:
        """The StepPlan of `batch` (with its tokens banned before min_tokens)."""
        return build_plan(seq, batch, sync_ops, async_ops, self.eos_ids, forget, self.tables)

    @abc.abstractmethod
    def submit(
        self, batch: Sequence[Job], sync_ops: Sequence[SwapOp], async_ops: Sequence[SwapOp]
    ) -> int:
        """Start a micro-batch; `batch` may be empty (copies only). Returns its ticket."""

    @abc.abstractmethod
    def result(self, ticket: int, timeout: float | None = None) -> StepResult | None:
        """The micro-batch's tokens, waiting up to `timeout` (None: until done)."""

    @abc.abstractmethod
    def forget(self, job_id: str) -> None:
        """The job ended: its sampling state (a seeded generator) can go."""

    def execute(self, batch: Sequence[Job]) -> list[int | JobFault | None]:
        """One blocking step without copies (the profiler's timing call)."""
        step = self.result(self.submit(batch, (), ()))
        assert step is not None
        return step.tokens

    def restart(self) -> None:
        """Replace failed workers (weights reloaded, KV empty); raise when impossible."""
        raise WorkerFailure("this executor cannot restart its workers")

    def check(self) -> None:
        """Before a micro-batch, none in flight: WorkerFailure if a worker died unseen
        (while idle). The in-process worker cannot die alone: nothing to check."""
        return None

    def close(self) -> None:
        """Release workers and copy threads."""
        self.swapper.close()


class LocalExecutor(Executor):
    """One in-process worker holding the whole model on one device."""

    copies_end_with_result = False

    def __init__(self, config: EngineConfig) -> None:
        spec = WorkerSpec(
            config.model,
            config.cache,
            device=config.model.device,
            threads=config.model.threads,
            max_batch_size=config.sched.max_batch_size,
        )
        self.worker = worker = Worker(spec)
        weight_bytes = worker.setup()
        self.num_device_blocks, self.num_host_blocks = worker.capacity()
        worker.allocate(self.num_device_blocks, self.num_host_blocks)
        assert worker.pool is not None and worker.swapper is not None
        info = worker.info
        self.loaded = ModelSummary(
            info.arch,
            info.tokenizer,
            info.dtype,
            worker.device,
            info.max_model_len,
            info.source,
            weight_bytes,
        )
        self.eos_ids = tuple(sorted(info.tokenizer.eos_token_ids))
        self.pool = worker.pool  # the KV tensors themselves (tests look inside)
        self.swapper = worker.swapper
        self.host_pool = worker.swapper.host_pool
        self._results: dict[int, StepResult | Callable[[], list[Any]]] = {}
        self._seq = 0
        self.tables = TableMirror()  # the worker keeps every table between steps
        ahead = config.model.schedule_ahead
        self.ahead = worker.device.type == "cuda" if ahead is None else ahead
        # scheduled ahead on a CPU, the model runs on a thread of its own: the host's
        # work for the next step overlaps it (a GPU overlaps by itself)
        on_cpu = worker.device.type != "cuda"
        self._thread = ThreadPoolExecutor(1, "fsd-model") if self.ahead and on_cpu else None
        self._running: Future[list[Any]] | None = None

    def close(self) -> None:
        """Release the copy thread, then the worker's weights and KV (their memory
        returns to the device: fsd.engine.worker.Worker.shutdown)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
        super().close()
        self.pool = self.swapper = self.host_pool = None  # type: ignore[assignment]
        self.worker.shutdown()

    def submit(
        self, batch: Sequence[Job], sync_ops: Sequence[SwapOp], async_ops: Sequence[SwapOp]
    ) -> int:
        # sync copies block before the step; async ones overlap it (side stream / thread)
        # and may outlive it: they end through swapper.poll(), with their jobs
        if (sync_ops or async_ops) and self._running is not None:
            self._running.result()  # the model thread's step writes the KV a copy reads
        self.swapper.run_sync(sync_ops)
        self.swapper.start(list(async_ops))
        self._seq += 1
        plans = self._planned(list(batch), self._seq)
        if not batch:
            self._results[self._seq] = StepResult([])
        elif self._thread is not None:  # the thread runs steps one after another, in order
            self._running = self._thread.submit(lambda: _values(self._launched(plans)))
            self._results[self._seq] = self._running.result
        elif self.ahead:  # queued on the device: read when collected
            launched = self._launched(plans)
            self._results[self._seq] = lambda: _values(launched)
        else:
            self._results[self._seq] = StepResult(_values(self._launched(plans)))
        return self._seq

    def _planned(self, batch: list[Job], seq: int) -> list[StepPlan | JobFault]:
        """The batch's plan, or (should laying a job out fail) the plans of its parts
        and the faults of the jobs that failed alone, in batch order."""
        try:
            return [self.plan(seq, batch)] if batch else []
        except Exception as exc:  # noqa: BLE001 - reported per job
            for job in batch:  # the plan is lost: their tables go whole next time
                self.tables.forget(job.job_id)
            if len(batch) == 1:
                return [JobFault.of("laying out the step", exc)]
        mid = len(batch) // 2
        return self._planned(batch[:mid], seq) + self._planned(batch[mid:], seq)

    def _launched(self, plans: list[StepPlan | JobFault]) -> list[Launched]:
        return [(p, p if isinstance(p, JobFault) else self._launch(p)) for p in plans]

    def _launch(self, plan: StepPlan, whole: bool = True) -> list[Any]:
        """The model step over `plan` (its StepTokens, in the plan's order), with a
        sequence that fails on its own isolated.

        If the step over the whole plan raises, its halves are re-run, recursively,
        until each failing part is a single sequence: that job gets a JobFault, every
        other job its token (k culprits cost about 2k log n extra steps; a failure
        that needs several jobs together, such as running out of memory, ends with
        every job served by smaller steps). Re-running is safe: a step rewrites the
        same KV slots and changes no job; and sampling never raises (a sampling
        fault is a JobFault row), so an exception means no job has drawn: a seeded
        job's generator advances exactly once, in the step that returns its token.
        """
        try:
            return [self.worker.launch(plan)]
        except WorkerFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - isolated below, reported per job
            if plan.num_seqs == 1:
                return [[JobFault.of("the model step", exc)]]
            if whole:
                log.warning(
                    "%s; re-running its %d jobs in halves to find the failing ones",
                    describe("the model step", exc),
                    plan.num_seqs,
                )
        n, mid = plan.num_seqs, plan.num_seqs // 2
        return self._launch(sub_plan(plan, range(mid)), False) + self._launch(
            sub_plan(plan, range(mid, n)), False
        )

    def result(self, ticket: int, timeout: float | None = None) -> StepResult | None:
        result = self._results.pop(ticket)
        return result if isinstance(result, StepResult) else StepResult(result())

    def forget(self, job_id: str) -> None:
        """Told the worker now, or on the model thread once its last step is done (in
        order with the steps: the next one may take the id anew)."""
        self.tables.forget(job_id)
        if self._running is None:
            self.worker.forget((job_id,))
        else:  # (run at once if that step is done: the thread is idle then)
            self._running.add_done_callback(lambda _: self.worker.forget((job_id,)))


# a plan and what launching it gave (StepTokens, or the faults of sequences that
# failed alone), or the fault of a job that could not be laid out
Launched = tuple[StepPlan | JobFault, Any]


def _values(launched: list[Launched]) -> list[int | JobFault | None]:
    """The tokens in batch order (waiting for the device's)."""
    out: list[int | JobFault | None] = []
    for plan, parts in launched:
        if isinstance(plan, JobFault):
            out.append(plan)
            continue
        rows: list[Any] = []
        for part in parts:
            rows += part if isinstance(part, list) else part.values()
        out += unorder(plan, rows)
    return out
