"""The job profiler: time the engine's own model steps and fit the `CostModel`.

Skip-join and the quanta rest on iteration time being predictable from shapes
(paper §4.1), so the profiler runs real iterations of the engine's model through
`engine.executor.execute` -- prefills across input lengths, decode steps across
batch sizes and context lengths, and (full profile) prefill chunks over cached
contexts -- and hands the timings to `fsd.cost.fit`. Repeats run
round-robin over the points, and a point whose repeats disagree is measured again. It also times a KV-sized host copy for
the swap bandwidth. `calibrate` is the engine's start-up: a saved profile, or a
quick one measured now. (`fsd profile` prints and saves a full one:
`fsd.profile_command`.)

Jobs are built by hand and run directly on the executor, not through the
scheduler: the engine calls `calibrate` before its scheduler exists (the scheduler
needs the cost model), and a decode point at context C only needs C tokens' worth
of blocks, not a real C-token prefill first (attention reads the blocks whatever
they hold).
"""

from __future__ import annotations

import datetime
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from fsd.cost import CostModel
from fsd.cost.fit import (
    ChunkSample,
    DecodeSample,
    PrefillSample,
    chunk_series,
    fit_cost_model,
)
from fsd.cost.profiles import load_profile
from fsd.errors import ConfigError
from fsd.jobs import Job, SamplingParams

Progress = Callable[[int, int, str], None]
"""progress(done, total, label): called after each timed sample (and the swap copy)."""

_PARAMS = SamplingParams(max_tokens=1, ignore_eos=True)  # greedy: no sampling state
log = logging.getLogger(__name__)

# The chunked prefills whose slowdown over a whole prefill a profile reports: a
# CHUNK_PROMPT-token prompt (or the longest the engine takes) in chunks of each size.
CHUNK_PROMPT = 2048
CHUNK_SIZES = (256, 512)
# The full profile also times chunks of these many new tokens over these many cached.
_CHUNK_NEW, _CHUNK_CACHED = (64, 256, 512), (512, 1536)


class ProfiledEngine(Protocol):
    """What the profiler needs of an engine (`fsd.engine.core.Engine` has it)."""

    loaded: Any  # ModelSummary: arch, dtype, device, source, weight_bytes
    executor: Any  # Executor: execute(jobs) -> tokens
    blocks: Any  # BlockManager: allocate / free / num_free / block_size
    config: Any  # EngineConfig
    max_model_len: int


# ---- the measurement plan ------------------------------------------------------------


@dataclass(frozen=True)
class ProfilePlan:
    """Which points to time and how often."""

    prefill_lengths: tuple[int, ...]
    decode_points: tuple[tuple[int, int], ...]  # (batch size, context length)
    repeats: int
    warmup_per_point: int
    extra_rounds: int  # at most this many more samples of a point whose repeats disagree
    swap_bytes: int
    swap_repeats: int
    chunk_points: tuple[tuple[int, int], ...] = ()  # (new tokens, cached tokens)
    chunk_prompt: int = CHUNK_PROMPT  # the chunked prefill the notes compare to a whole one
    chunk_sizes: tuple[int, ...] = CHUNK_SIZES

    @property
    def num_samples(self) -> int:
        return len(self.prefill_lengths) + len(self.decode_points) + len(self.chunk_points)

    @property
    def num_points(self) -> int:
        """Progress steps: every timed sample, plus the swap copy."""
        return self.num_samples * self.repeats + 1

    @property
    def max_iterations(self) -> int:
        """Engine iterations at most: warm-ups, repeats and re-measured noisy points."""
        per_point = self.repeats + self.warmup_per_point + self.extra_rounds
        return self.num_samples * per_point + 2


def _geometric(lo: int, hi: int, factor: int) -> list[int]:
    out: list[int] = []
    n = lo
    while n < hi:
        out.append(n)
        n *= factor
    out.append(hi)
    return sorted(set(v for v in out if v >= 1))


def _chunk_points(prompt: int, max_new: int, max_total: int) -> tuple[tuple[int, int], ...]:
    """A grid of new x cached tokens for the fit, and every chunk but the first (a
    prefill) of the chunked prefills whose slowdown the notes report."""
    grid = {
        (n, c) for n in _CHUNK_NEW for c in _CHUNK_CACHED if n <= max_new and n + c <= max_total
    }
    series = {p for k in CHUNK_SIZES for p in chunk_series(prompt, k) if p[1] > 0}
    return tuple(sorted(grid | series))


def make_plan(engine: ProfiledEngine, quick: bool) -> ProfilePlan:
    """Points that fit the engine's limits: context length, batch size, free KV blocks.

    Only the full profile times prefill chunks: the two a fit needs at least (64 over
    512 and 256 over 1536 cached tokens) would lengthen the quick calibration at engine
    start by nearly half, so that derives the chunk term instead (`fit_cost_model`)."""
    blocks = engine.blocks
    bs = blocks.block_size
    free_tokens = blocks.num_free * bs
    sched = engine.config.sched
    max_len = engine.max_model_len
    max_prefill = min(max_len - 1, sched.max_batch_tokens, free_tokens)
    if max_prefill < 1:
        raise ConfigError("the engine has no room for even a one-token prefill to profile")
    max_ctx = min(max_len, free_tokens)
    max_batch = max(1, sched.max_batch_size)
    prompt = min(CHUNK_PROMPT, max_prefill)
    chunks: tuple[tuple[int, int], ...] = ()
    if quick:
        # Four lengths pin down base, linear and quadratic terms; 512 keeps a tiny
        # model on a CPU well under a second while still showing the n^2 bend.
        lengths = sorted({min(n, max_prefill) for n in (16, 64, 256, 512)})
        batches = sorted({1, min(8, max_batch)})
        contexts = sorted({min(16, max_ctx), min(512, max_ctx)})
        repeats, warmup, extra, swap_bytes, swap_repeats = 3, 0, 2, 32 << 20, 3
    else:
        lengths = _geometric(16, max_prefill, 2)
        lengths = sorted({*lengths, prompt, *(k for k in CHUNK_SIZES if k < prompt)})
        max_new = min(sched.max_batch_tokens, max_prefill)
        chunks = _chunk_points(prompt, max_new, min(max_len - 1, free_tokens))
        batches = _geometric(1, max_batch, 2)
        contexts = _geometric(16, max_ctx, 4)
        repeats, warmup, extra, swap_repeats = 5, 1, 3, 5
        swap_bytes = (256 << 20) if engine.loaded.device.type == "cuda" else (64 << 20)
    points = tuple(
        (b, c) for b in batches for c in contexts if b * blocks.blocks_for(c) <= blocks.num_free
    )
    if not points:
        points = ((1, 1),)
    return ProfilePlan(
        tuple(lengths), points, repeats, warmup, extra, swap_bytes, swap_repeats, chunks, prompt
    )


# ---- timing real iterations -------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Timer:
    """Runs hand-built (greedy) batches on the engine's executor; gives the blocks back."""

    def __init__(self, engine: ProfiledEngine) -> None:
        self.engine = engine
        self.device = engine.loaded.device
        self.vocab = engine.loaded.arch.vocab_size
        self.iterations = 0
        self._seq = 0

    def _job(self, num_tokens: int, computed: int) -> Job:
        self._seq += 1
        ids = [(17 * i + 5) % self.vocab for i in range(num_tokens)]
        job = Job(prompt_token_ids=ids, params=_PARAMS, job_id=f"profile-{self._seq}")
        job.num_computed_tokens = computed
        job.step_tokens = num_tokens - computed  # all its new tokens: a prefill, chunk or decode
        return job

    def run(self, specs: Sequence[tuple[int, int]]) -> float:
        """Time one iteration over jobs of (num_tokens, already computed) each."""
        jobs = [self._job(n, c) for n, c in specs]
        blocks = self.engine.blocks
        held: list[Job] = []
        try:
            for job in jobs:
                blocks.allocate(job)
                held.append(job)
            _sync(self.device)
            start = time.perf_counter()
            self.engine.executor.execute(jobs)
            _sync(self.device)
            elapsed = time.perf_counter() - start
        finally:
            for job in held:
                blocks.free(job)
            for job in jobs:  # the worker keeps a ran job's table until told
                self.engine.executor.forget(job.job_id)
        self.iterations += 1
        return elapsed


def measure_swap_bandwidth(
    device: torch.device, dtype: torch.dtype, nbytes: int, repeats: int
) -> dict[str, object]:
    """Time copying a KV-sized buffer out to host memory and back.

    On CUDA: device <-> pinned host buffer (the swap path); on CPU: between two CPU
    tensors. Returns both directions' times and the rate over their mean.
    """
    elem = torch.empty((), dtype=dtype).element_size()
    numel = max(1, nbytes // elem)
    src = torch.zeros(numel, dtype=dtype, device=device)
    pin = device.type == "cuda"
    host = torch.empty(numel, dtype=dtype, device="cpu", pin_memory=pin)
    out_s: list[float] = []
    in_s: list[float] = []
    for _ in range(repeats + 1):  # the first round warms the allocator and the link
        _sync(device)
        t0 = time.perf_counter()
        host.copy_(src, non_blocking=pin)
        _sync(device)
        t1 = time.perf_counter()
        src.copy_(host, non_blocking=pin)
        _sync(device)
        t2 = time.perf_counter()
        out_s.append(t1 - t0)
        in_s.append(t2 - t1)
    out_s, in_s = out_s[1:], in_s[1:]
    mean = (statistics.median(out_s) + statistics.median(in_s)) / 2
    return {
        "bytes": numel * elem,
        "out_s": out_s,
        "in_s": in_s,
        "bytes_per_s": numel * elem / max(mean, 1e-9),
        "method": "pinned host <-> device copy" if pin else "CPU tensor to CPU tensor copy",
    }


def machine_info(device: torch.device) -> dict[str, object]:
    """Where the profile was taken (no user or host names)."""
    info: dict[str, object] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def _time_points(
    plan: ProfilePlan, timer: _Timer, tick: Callable[[str], None]
) -> tuple[list[PrefillSample], list[DecodeSample], list[ChunkSample]]:
    """Every point's repeats, round-robin, then the noisy points again."""
    prefill = [PrefillSample(n) for n in plan.prefill_lengths]
    decode = [DecodeSample(b, c) for b, c in plan.decode_points]
    chunk = [ChunkSample(n, c) for n, c in plan.chunk_points]
    samples: list[PrefillSample | DecodeSample | ChunkSample] = [*prefill, *decode, *chunk]
    # Warm up once (lazy allocations, kernel selection / JIT) outside any sample.
    timer.run(prefill[0].specs)
    timer.run(decode[0].specs)
    # Repeats go round-robin over the points: a burst of noise from elsewhere on the
    # machine then spoils one sample of several points, and their fastest repeats
    # survive it, instead of every sample of one point.
    for r in range(plan.repeats):
        for s in samples:
            for _ in range(plan.warmup_per_point if r == 0 else 0):
                timer.run(s.specs)
            s.times.append(timer.run(s.specs))
            tick(s.label)
    for _ in range(plan.extra_rounds):
        again = [s for s in samples if s.noisy]
        if not again:
            break
        for s in again:
            s.times.append(timer.run(s.specs))
    return prefill, decode, chunk


def profile_engine(
    engine: ProfiledEngine,
    quick: bool = True,
    progress: Progress | None = None,
    plan: ProfilePlan | None = None,
) -> CostModel:
    """Measure `engine`'s iterations and return the fitted CostModel.

    quick: a calibration of 26-42 iterations (about 0.3 s for the tiny model on two
    idle CPU cores); otherwise, for `fsd profile`, a sweep of prefill lengths, batch
    sizes x contexts and prefill chunks over cached contexts, five repeats each.
    `plan`: these points instead of `make_plan`'s. Every KV block is free afterwards.
    """
    plan = plan or make_plan(engine, quick)
    timer = _Timer(engine)
    loaded = engine.loaded
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, plan.num_points, label)

    prefill, decode, chunk = _time_points(plan, timer, tick)
    swap = measure_swap_bandwidth(loaded.device, loaded.dtype, plan.swap_bytes, plan.swap_repeats)
    tick("swap copy")

    tp = max(1, int(getattr(getattr(engine.config, "parallel", None), "tp", 1)))
    dtype_name = str(loaded.dtype).removeprefix("torch.")
    name = f"{_model_name(loaded)}-{loaded.device.type}-{dtype_name}"
    swap_rate = float(swap["bytes_per_s"]) * tp  # each TP rank moves its shard on its own link
    notes: dict[str, object] = {
        "source": "measured (fsd.engine.profiler)",
        "mode": "quick" if quick else "full",
        "profiled_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "iterations": timer.iterations,
        "engine": engine_fingerprint(engine),
        "machine": machine_info(loaded.device),
        "swap": swap,
    }
    return fit_cost_model(
        prefill,
        decode,
        chunk,
        name=name,
        kv_bytes_per_token=int(loaded.arch.kv_bytes_per_token(loaded.dtype)),
        swap_bytes_per_s=swap_rate,
        chunk_prompt=plan.chunk_prompt,
        chunk_sizes=plan.chunk_sizes,
        notes=notes,
    )


def _model_name(loaded: Any) -> str:
    source = str(getattr(loaded, "source", "model"))
    return source.removeprefix("preset:") if source.startswith("preset:") else Path(source).name


def engine_fingerprint(engine: ProfiledEngine) -> dict[str, object]:
    """What a saved profile must match to describe this engine."""
    loaded = engine.loaded
    return {
        "model": str(getattr(loaded, "source", "")),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device": loaded.device.type,
        "weight_bytes": int(loaded.weight_bytes),
        "block_size": int(engine.blocks.block_size),
        "tp": int(getattr(getattr(engine.config, "parallel", None), "tp", 1)),
    }


def calibrate(engine: ProfiledEngine, cache_path: str | Path | None = None) -> CostModel:
    """The engine's cost model at start-up (`sched.profile` is passed as `cache_path`).

    None: a quick profile of this engine. A shipped profile name ("opt-13b-a100") or an
    existing JSON file: load it -- the user chose it, so a profile taken for another
    model or device is used as given, with a warning logged and kept in its notes. A
    `.json` path that does not exist yet: profile quickly and save it there, so the
    next start loads it. Anything else is an unknown profile (ConfigError).
    """
    if cache_path is None:
        return profile_engine(engine, quick=True)
    path = Path(cache_path)
    if not path.exists() and path.suffix == ".json":
        cost = profile_engine(engine, quick=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        cost.save(path)
        return cost
    cost = load_profile(cache_path)
    seen = cost.notes.get("engine")
    if isinstance(seen, dict):
        mine = engine_fingerprint(engine)
        diff = sorted(k for k in ("model", "dtype", "device") if seen.get(k) != mine[k])
        if diff:
            warning = f"profile {cache_path} was taken for another {', '.join(diff)}"
            log.warning("%s; using it as given", warning)
            cost = replace(cost, notes={**cost.notes, "warning": warning})
    return cost
