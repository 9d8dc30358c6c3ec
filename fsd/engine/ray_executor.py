"""Tensor x pipeline parallel execution on Ray actors (paper §4.3, DESIGN.md §5).

tp x pp workers (`fsd.engine.worker.Worker` as Ray actors): stage s holds layers
`stage_spans(L, pp)[s]`, and its tp ranks shard heads and MLP with torch.distributed
(NCCL on GPU, gloo on CPU). The driver -- this process -- keeps the scheduler and
the block manager and sends every worker the same `StepPlan`.

A micro-batch is one chain of actor calls submitted at once: every rank of stage 0
gets the plan; every rank of stage s gets the plan and an unresolved reference to
stage s-1's activations (from its TP rank 0), so it starts its swap copies and then
receives them. Ray runs each actor's calls in order, so with up to `pp` micro-batches
submitted, stage 0 works on micro-batch i+1 while stage 1 works on i. Each worker
runs the same `Worker.step` as the in-process executor; the last stage's TP rank 0
samples there and returns only token ids. Job ids whose sampling state can go
travel with the next plan.

A worker that dies fails its micro-batch: `result` raises WorkerFailure, naming it.
`restart` kills every worker (a TP group cannot re-admit one rank) and starts a
fresh set: weights reloaded, KV empty. One that died idle is found by `check` (a
ping before the first micro-batch after IDLE_CHECK s without one): the request that
ends the idle time runs on fresh workers, not fails with them. `healthy`: they served.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fsd.config import CacheConfig, EngineConfig
from fsd.cost.stages import split_layers
from fsd.engine.executor import Executor, ModelSummary, StepResult, WorkerFailure
from fsd.engine.plan import StepPlan, unorder
from fsd.engine.ray_cluster import ensure_ray, worker_env, worker_placement
from fsd.engine.stage import stage_spans
from fsd.engine.worker import Worker, WorkerSpec
from fsd.errors import ConfigError, FsdError
from fsd.jobs import Job
from fsd.kv.swap import SwapOp
from fsd.models.arch import ModelArch
from fsd.models.loader import describe_model, resolve_dtype

log = logging.getLogger("fsd.engine")

_POLL = 0.05  # seconds between checks of a micro-batch's workers (a failure shows this fast)
STARTUP_TIMEOUT = 300.0  # seconds for workers to be placed, load weights and allocate KV
IDLE_CHECK = 1.0  # seconds without a micro-batch after which `check` pings the workers
_PING_TIMEOUT = 30.0  # seconds idle workers get to answer a ping


def validate_parallel(arch: ModelArch, tp: int, pp: int) -> None:
    """ConfigError naming the model field that tp or pp does not fit."""
    if arch.num_heads % tp:
        raise ConfigError(f"tp={tp} must divide the model's num_heads ({arch.num_heads})")
    kv = arch.num_kv_heads
    if kv % tp and tp % kv:
        raise ConfigError(
            f"tp={tp} must divide the model's num_kv_heads ({kv}) or be a multiple of it"
        )
    if arch.intermediate_size % tp:
        raise ConfigError(
            f"tp={tp} must divide the model's intermediate_size ({arch.intermediate_size})"
        )
    split_layers(arch.num_layers, pp)  # pp <= num_layers


def shard_budgets(cache: CacheConfig, world: int) -> CacheConfig:
    """Each worker's share of the byte budgets that are totals for the whole model.

    cpu_device_kv_bytes (the device tier on CPU) and host_kv_bytes (the swap tier) are host
    memory of the machine, so tp x pp CPU workers split them and the engine gets
    about as many blocks as one device would; gpu_memory_utilization is per GPU.
    """
    return dataclasses.replace(
        cache,
        cpu_device_kv_bytes=max(1, cache.cpu_device_kv_bytes // world),
        host_kv_bytes=cache.host_kv_bytes // world,
    )


@dataclass
class _InFlight:
    plan: StepPlan
    batch: list[Job]
    async_ops: list[SwapOp]
    status: dict[Any, str]  # status ref -> worker label, until it resolves
    final: Any  # the last stage's TP rank 0 payload
    copy_bytes: dict[str, int] = field(default_factory=dict)


class RemoteSwapTotals:
    """The engine's view of copies made in the workers (they end with their micro-batch)."""

    def __init__(self) -> None:
        self.bytes_out = 0
        self.bytes_in = 0
        self.bytes_in_flight = 0
        self.busy = False  # nothing outlives a micro-batch

    def poll(self) -> list[SwapOp]:
        return []

    def wait(self, timeout: float | None = None) -> list[SwapOp]:
        return []

    def close(self) -> None:
        return None


class RayExecutor(Executor):
    """tp x pp Ray actors; up to pp micro-batches in flight."""

    def __init__(self, config: EngineConfig) -> None:
        par = config.parallel
        self.config = config
        self.tp, self.pp = par.tp, par.pp
        info = describe_model(config.model, torch.device("cpu"))
        validate_parallel(info.arch, self.tp, self.pp)  # before Ray starts: fail fast
        self.spans = stage_spans(info.arch.num_layers, self.pp)
        # in every actor name: two executors in one process (two LLMs) must not clash
        self.uid = uuid.uuid4().hex[:8]
        self.ray, self._owns_ray = ensure_ray(par.ray_address)
        self.worker_device = self._device_kind(config.model.device)
        dtype = info.dtype
        if self.worker_device == "cuda":
            dtype = resolve_dtype(
                config.model.dtype, torch.device("cuda"), info.arch.checkpoint_dtype
            )
        # the driver times steps on the CPU: ray.get waits for the workers' devices
        cpu = torch.device("cpu")
        self.loaded = ModelSummary(
            info.arch, info.tokenizer, dtype, cpu, info.max_model_len, info.source
        )
        self.eos_ids = tuple(sorted(info.tokenizer.eos_token_ids))
        self.max_in_flight = self.pp
        self.swapper = RemoteSwapTotals()
        self.restarts = 0
        self.workers: list[list[Any]] = []
        self._flight: dict[int, _InFlight] = {}
        self._forget: list[str] = []  # sent with the next plan
        self._seq = 0
        self._bytes_per_block = 0
        self._heard = time.monotonic()  # when every worker last answered
        self.healthy = False  # a micro-batch has completed on the workers now running
        try:
            self._start_workers()
            caps = self._call_all("capacity")
            self.num_device_blocks = min(c[0] for c in caps)
            self.num_host_blocks = min(c[1] for c in caps)
            self._allocate()
        except BaseException:
            self.close()
            raise

    # ---- workers ---------------------------------------------------------------

    def _device_kind(self, name: str) -> str:
        world = self.tp * self.pp
        gpus = int(self.ray.cluster_resources().get("GPU", 0))
        if name == "cuda" and gpus < world:
            raise ConfigError(
                f"tp={self.tp} x pp={self.pp} needs {world} GPUs; the Ray cluster has {gpus}"
            )
        if name == "auto":
            return "cuda" if gpus >= world else "cpu"
        return name

    def _actor_options(self) -> dict[str, Any]:
        world = self.tp * self.pp
        opts: dict[str, Any] = {"runtime_env": {"env_vars": worker_env()}, "namespace": "fsd"}
        if self.worker_device == "cuda":
            opts.update(num_gpus=1, num_cpus=0)
        else:
            cpus = float(self.ray.cluster_resources().get("CPU", 1))
            opts["num_cpus"] = min(1.0, cpus / world)  # every CPU actor must fit at once
        return opts

    def _start_workers(self) -> None:
        remote_worker = self.ray.remote(Worker)
        opts = self._actor_options()
        # CPU actors share the cores, one left to the driver: spinning OpenMP threads
        # on an oversubscribed core slow a step down many times over
        cpus = min(int(self.ray.cluster_resources().get("CPU", 1)), os.cpu_count() or 1)
        cfg = self.config
        threads = cfg.model.threads or max(1, (cpus - 1) // (self.tp * self.pp))
        cache = shard_budgets(cfg.cache, self.tp * self.pp)
        # a replica's own placement group (fsd.cluster.groups) holds a bundle per worker
        placed = worker_placement(self.tp * self.pp)
        self.workers = [
            [
                remote_worker.options(
                    name=self.actor_name(span.index, r),
                    **{**opts, **(placed[s * self.tp + r] if placed else {})},
                ).remote(WorkerSpec(cfg.model, cache, self.tp, r, span, self.worker_device, threads))
                for r in range(self.tp)
            ]
            for s, span in enumerate(self.spans)
        ]
        if self.tp > 1:
            masters = self._get([stage[0].rendezvous.remote() for stage in self.workers])
        else:
            masters = [None] * self.pp
        sizes = self._get(
            [w.setup.remote(masters[s]) for s, stage in enumerate(self.workers) for w in stage]
        )
        self.loaded.weight_bytes = int(sum(sizes))
        log.info(
            "%d workers up (tp=%d x pp=%d on %s), %.1f MB of weights",
            self.tp * self.pp,
            self.tp,
            self.pp,
            self.worker_device,
            self.loaded.weight_bytes / 1e6,
        )

    def _allocate(self) -> None:
        per_shard = self._call_all("allocate", self.num_device_blocks, self.num_host_blocks)
        self._bytes_per_block = int(sum(per_shard))

    def _all(self) -> list[Any]:
        return [w for stage in self.workers for w in stage]

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        return self._get([getattr(w, method).remote(*args) for w in self._all()])

    def _get(self, refs: list[Any]) -> list[Any]:
        try:
            return self.ray.get(refs, timeout=STARTUP_TIMEOUT)
        except self.ray.exceptions.GetTimeoutError:
            raise WorkerFailure(
                f"the {self.tp * self.pp} workers did not start within {STARTUP_TIMEOUT:.0f} s: "
                "does the Ray cluster have a free GPU (or CPU share) for each?"
            ) from None
        except Exception as exc:
            raise _as_fsd_error(exc, "starting the workers") from None

    def _kill_workers(self) -> None:
        for w in self._all():
            try:
                self.ray.kill(w, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - already gone is fine
                log.debug("kill: %s", exc)
        self.workers = []

    def actor_name(self, stage: int, rank: int, generation: int | None = None) -> str:
        """The worker's Ray actor name, in namespace "fsd" (`ray list actors` shows it).

        generation counts restarts, so fresh workers never clash with dying ones;
        `uid` tells this executor's workers from another's in the same process.
        """
        gen = self.restarts if generation is None else generation
        return f"fsd-{os.getpid()}-{self.uid}-g{gen}-s{stage}-r{rank}"

    def worker_handles(self) -> list[list[Any]]:
        """The actors, [stage][tp rank] (operators and tests: kill one to see recovery)."""
        return [list(stage) for stage in self.workers]

    # ---- micro-batches -----------------------------------------------------------

    def submit(
        self, batch: Sequence[Job], sync_ops: Sequence[SwapOp], async_ops: Sequence[SwapOp]
    ) -> int:
        self._seq += 1
        plan = self.plan(self._seq, batch, sync_ops, async_ops, self._forget)
        plan_ref = self.ray.put(plan)
        self._forget = []
        status: dict[Any, str] = {}
        prev: list[Any] | None = None
        final = None
        for s, stage in enumerate(self.workers):
            payload = None
            for r, w in enumerate(stage):
                st, out = w.execute.options(num_returns=2).remote(plan_ref, prev)
                status[st] = f"stage {s} tp rank {r}"
                if r == 0:
                    payload = out
            prev, final = [payload], payload
        bpb = self._bytes_per_block
        moved = {
            d: sum(op.num_blocks for op in [*sync_ops, *async_ops] if op.direction == d) * bpb
            for d in ("out", "in")
        }
        self.swapper.bytes_in_flight += moved["out"] + moved["in"]
        self._flight[self._seq] = _InFlight(
            plan, list(batch), list(async_ops), status, final, moved
        )
        return self._seq

    def result(self, ticket: int, timeout: float | None = None) -> StepResult | None:
        f = self._flight[ticket]
        deadline = None if timeout is None else time.monotonic() + timeout
        while f.status:
            left = _POLL if deadline is None else min(_POLL, max(0.0, deadline - time.monotonic()))
            ready, _ = self.ray.wait(list(f.status), num_returns=len(f.status), timeout=left)
            for ref in ready:
                label = f.status.pop(ref)
                try:
                    self.ray.get(ref)
                except Exception as exc:
                    raise self._failure(f, label, exc) from None
            if f.status and deadline is not None and time.monotonic() >= deadline:
                return None
        try:
            rows = self.ray.get(f.final) if f.plan.has_model_step else []
        except Exception as exc:
            raise WorkerFailure(f"the last stage failed: {_describe(exc)}") from None
        del self._flight[ticket]
        self._heard, self.healthy = time.monotonic(), True
        self.swapper.bytes_out += f.copy_bytes["out"]
        self.swapper.bytes_in += f.copy_bytes["in"]
        self.swapper.bytes_in_flight -= f.copy_bytes["out"] + f.copy_bytes["in"]
        return StepResult(unorder(f.plan, rows) if f.batch else [], f.async_ops)

    def _failure(self, f: _InFlight, label: str, exc: BaseException) -> WorkerFailure:
        """Name the root cause: a dead actor rather than its peers' broken collectives."""
        died = self.ray.exceptions.RayActorError
        if not isinstance(exc, died):
            ready, _ = self.ray.wait(list(f.status), num_returns=len(f.status), timeout=1.0)
            for ref in ready:
                try:
                    self.ray.get(ref)
                except died as other:
                    label, exc = f.status[ref], other
                    break
                except Exception:  # noqa: BLE001 - another symptom of the same failure
                    continue
        verb = "died" if isinstance(exc, died) else "failed"
        return WorkerFailure(f"worker {label} {verb}: {_describe(exc)}")

    def forget(self, job_id: str) -> None:
        self._forget.append(job_id)

    def check(self) -> None:
        if self._flight or time.monotonic() - self._heard < IDLE_CHECK:
            return
        refs = {
            w.ping.remote(): f"stage {s} tp rank {r}"
            for s, stage in enumerate(self.workers)
            for r, w in enumerate(stage)
        }
        ready, late = self.ray.wait(list(refs), num_returns=len(refs), timeout=_PING_TIMEOUT)
        for ref in ready:
            try:
                self.ray.get(ref)
            except Exception as exc:
                why = f"worker {refs[ref]} died while idle: {_describe(exc)}"
                raise WorkerFailure(why) from None
        if late:
            who = ", ".join(refs[r] for r in late)
            raise WorkerFailure(f"idle workers ({who}) did not answer within {_PING_TIMEOUT:.0f} s")
        self._heard = time.monotonic()

    # ---- failure and shutdown -----------------------------------------------------

    def restart(self) -> None:
        """Kill every worker and start a fresh set (weights reloaded, KV empty)."""
        self._flight.clear()
        self._forget = []  # fresh workers hold no sampling state
        self.swapper.bytes_in_flight = 0
        self._kill_workers()
        self.restarts += 1
        self.healthy = False
        try:
            self._start_workers()
            self._allocate()
            self._heard = time.monotonic()
        except BaseException:
            self._kill_workers()
            raise

    def close(self) -> None:
        self._flight.clear()
        self._kill_workers()
        if self._owns_ray:
            self.ray.shutdown()
            self._owns_ray = False


def _describe(exc: BaseException) -> str:
    """A one-line reason: the worker's own exception when Ray wraps one."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = str(exc).strip().splitlines()
    first = next((line for line in reversed(text) if line.strip()), "") if text else ""
    return f"{type(exc).__name__}: {first}"[:300]


def _as_fsd_error(exc: BaseException, doing: str) -> FsdError:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, FsdError):
        return cause
    return WorkerFailure(f"{doing} failed: {_describe(exc)}")
