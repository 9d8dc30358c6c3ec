"""The plain values the engine's face (`fsd.engine.face`) hands out.

Copies, never live scheduler objects: a row or a snapshot taken now stays
what it was when the engine moves on, and each could be pickled across a process
boundary (a replica in another process answers with the same values).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fsd.config import EngineConfig
from fsd.engine.events import wire_level
from fsd.engine.output import IterationStats, StepDelta
from fsd.jobs import Job
from fsd.kv.block_manager import KVStats
from fsd.protocol_telemetry import JobInfo, KVInfo, PrefixInfo, ReplicaInfo, RouteInfo
from fsd.sched.decision import SchedulerStats


@dataclass(frozen=True)
class EngineInfo:
    """What an engine serves and its fixed bounds (they never change while it runs)."""

    source: str  # the model as loaded: a preset name or a path
    model: str  # the model as configured (the served name's default)
    max_model_len: int
    vocab_size: int
    kv_tokens: int  # tokens the device KV pool holds
    slo: float  # the default per-token latency SLO of its cost model (seconds)


# the tags of every untagged job's row: one list, not one per row (a row is read,
# never changed: `EngineFace.jobs`; a queue of a flood's size would hold megabytes)
_NO_TAGS: list[str] = []


def job_info(job: Job, now: float, rank: int | None = None) -> JobInfo:
    """One live job as clients see it (the wire's row: level and rank 1-based, 1 = Q1
    and 1 runs first); `rank` 0-based as `JobQueue.ranks` gives it (None: not known)."""
    return JobInfo(
        job_id=job.job_id,
        state=job.status.value,
        level=wire_level(job.level),
        kv=job.kv.value,
        blocks=len(job.block_table),
        host_blocks=len(job.host_block_table),
        enst=job.enst,
        prompt_tokens=job.num_prompt_tokens,
        prefilled=job.num_prefilled,
        output_tokens=len(job.output_token_ids),
        waited=max(0.0, now - job.last_run),
        attained=job.attained,
        arrival=job.arrival_time,
        preemptions=job.preemptions,
        swaps_out=job.swaps_out,
        swaps_in=job.swaps_in,
        recomputes=job.recomputes,
        promotions=job.promotions,
        demotions=job.demotions,
        tags=list(job.tags) if job.tags else _NO_TAGS,
        rank=None if rank is None else rank + 1,
        cached_tokens=job.num_cached_tokens,
    )


@dataclass(frozen=True)
class SwapBytes:
    """The KV copies between tiers: bytes moving now, and moved out and in so far."""

    in_flight: int
    out: int
    into: int


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's observable state at `time`: scheduler, KV, prefix cache, recent
    iterations; the job table only when asked for (it costs microseconds a job)."""

    time: float
    config: EngineConfig
    sched: SchedulerStats
    kv: KVStats
    swap: SwapBytes
    prefix: PrefixInfo
    iterations: list[IterationStats]  # the most recent, oldest first
    iteration_count: int  # iterations run since start
    live: int  # jobs not finished
    running: int  # of them, in the last batch
    degraded: str | None
    jobs: list[JobInfo] | None = None
    replicas: list[ReplicaInfo] | None = None  # several replicas (fsd.cluster): each one
    routes: list[RouteInfo] | None = None  # and the router's recent decisions


@dataclass(frozen=True)
class Admitted:
    """A job the engine took: its id and its prompt's length in tokens."""

    job_id: str
    prompt_tokens: int


@dataclass(frozen=True)
class Stepped:
    """One step: each job's new tokens, the iterations it completed, its wall time,
    and what failed on the way (`(what, exception)`; the jobs a bug hit were failed)."""

    deltas: list[StepDelta]
    iterations: list[IterationStats]
    seconds: float
    failures: list[tuple[str, Exception]] = field(default_factory=list)


def kv_info(snap: EngineSnapshot) -> KVInfo:
    """The snapshot's KV pools and copies as the wire carries them."""
    return KVInfo(
        **dataclasses.asdict(snap.kv),
        device_reserved=snap.sched.reserve,
        bytes_in_flight=snap.swap.in_flight,
        swapped_out_bytes=snap.swap.out,
        swapped_in_bytes=snap.swap.into,
    )
