"""Moving a preempted job from one engine to another: its state, its KV from the host
tier, and its sampler's place, so it goes on with the tokens it would have made.

The engine's own bookkeeping (its jobs, their text, the batches in flight) is read
and written here, beside it: this module is the engine's, kept out of `core` for size.

A job can move when no copy of its KV is in flight and it is not in a batch: one
that never ran or whose KV was dropped (it recomputes there), or one preempted to host
memory (its host blocks travel: a copy of their bytes, one tensor). A job running on
the device stays where it is; only an engine in this process (tp = pp = 1) moves jobs.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsd.engine.detokenizer import JobDetokenizer
from fsd.errors import FsdError, UnknownJobError
from fsd.jobs import Job, JobStatus, KVLocation

if TYPE_CHECKING:
    from fsd.engine.core import Engine


class CannotMove(FsdError):
    """This job cannot move now (why says when it could)."""

    code = "cannot-move"


@dataclass
class MovedJob:
    """A job taken out of one engine, with what the next one needs to go on."""

    job: Job  # its tokens, sampling, counters; no blocks
    kv: Any = None  # its host blocks [blocks, layers, 2, block_size, heads, dim] (a copy)
    seed_state: Any = None  # its seeded generator's state


def why_not(engine: Engine, job: Job) -> str | None:
    """Why `job` cannot move now (None: it can)."""
    if not hasattr(engine, "host_pool"):
        return "only an engine in this process (tp = pp = 1) moves its jobs"
    if job.status is JobStatus.RUNNING or job.job_id in engine._flight.busy:
        return "it is running"
    if job.kv not in (KVLocation.NONE, KVLocation.HOST) or job.block_table:
        return f"its KV is {job.kv.value}: only a job on the host or without KV moves"
    return None


def take_out(engine: Engine, job_id: str) -> MovedJob:
    """Remove a movable job, keeping everything it needs elsewhere (CannotMove if not)."""
    job = engine.scheduler.get(job_id)
    if job is None:
        raise UnknownJobError(f"no job with id {job_id!r}")
    reason = why_not(engine, job)
    if reason is not None:
        raise CannotMove(f"job {job_id} cannot move now: {reason}")
    kv = None
    if job.kv is KVLocation.HOST:
        kv = engine.host_pool.data[job.host_block_table].clone()
    seed_state = engine.executor.worker.sampler.seed_state(job_id)
    engine.scheduler.remove(job)  # its blocks go back to this engine's pools
    engine._release(job)  # and the engine forgets it (its text, its sampler)
    engine.events.add(time.time(), "migrate-out", job)
    computed = job.num_computed_tokens if kv is not None else 0  # else it recomputes
    moved = dataclasses.replace(
        job, block_table=[], host_block_table=[], kv=KVLocation.NONE, num_computed_tokens=computed
    )
    return MovedJob(moved, kv, seed_state)


def bring_in(engine: Engine, moved: MovedJob) -> Job:
    """Queue a job moved from another engine here; its KV onto this host tier."""
    job = dataclasses.replace(moved.job, block_table=[], host_block_table=[], kv=KVLocation.NONE)
    if job.job_id in engine._jobs:
        raise FsdError(f"job {job.job_id} is already here")
    if moved.kv is not None:
        blocks = engine.blocks.receive_on_host(job, int(moved.kv.shape[0]))
        engine.host_pool.data[blocks] = moved.kv
        job.status = JobStatus.PREEMPTED
    else:
        job.num_computed_tokens = 0
        job.status = JobStatus.WAITING
    engine.executor.worker.sampler.restore(job.job_id, job.params, moved.seed_state)
    detok = JobDetokenizer(engine.tokenizer, job.prompt_token_ids, job.params.stop)
    for token in job.output_token_ids:  # what its client has already seen
        detok.add(token)
    now = time.time()
    engine.scheduler.add(job, now)
    engine._jobs[job.job_id] = job
    engine._text[job.job_id] = detok
    engine.history.arrived(now)
    engine.events.add(now, "migrate-in", job)
    return job
