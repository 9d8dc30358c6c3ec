"""The room a queued job may start in this iteration (admission within the scheduler), and
the per-token latency a queued job is predicted to see.

Whether a request is accepted at all is decided once, where it enters (fsd.admission).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fsd.jobs import Job
from fsd.kv.block_manager import BlockManager

if TYPE_CHECKING:
    from fsd.cost import CostModel
    from fsd.sched.queues import JobQueue

NO_CONTEXT_LIMIT = 1 << 62  # the simulator's model has no context length


# the gate's growth headroom takes at most 1/HEADROOM_SHARE of the device pool: a
# block per batch slot would idle most of a small pool
HEADROOM_SHARE = 4


def admission_room(blocks: BlockManager, admit_fraction: float, gate_slots: int | None) -> float:
    """Blocks that jobs without KV may still take this iteration.

    Why: under overload, starting more jobs than device + host can hold means some
    started job must later drop its KV (recompute) with nowhere to go; capping what
    new jobs may take keeps the started ones whole. With nothing started, anything
    that fits is admitted (no job is ever refused forever). `gate_slots` (fsd's swap
    gate: the batch size; None: off): started work fits the device itself, less a
    block for each slot to grow into (at most a quarter of a small pool); a start
    beyond it would send a started job to host
    memory, and back, for nothing the batch needed (fsd.kv.planner.SwapGate). Under
    the gate the bound holds from the first iteration: with nothing started the walk
    admits its first job whatever its size (`first_admission_free`), and the rest
    within the room, so a batch never starts more prompts than it can finish with.
    """
    used = blocks.device.num_used + blocks.host.num_used
    if used == 0 and gate_slots is None:
        return float("inf")
    room = admit_fraction * (blocks.device.num_blocks + blocks.host.num_blocks) - used
    if gate_slots is not None:
        headroom = min(gate_slots, blocks.device.num_blocks // HEADROOM_SHARE)
        room = min(room, blocks.device.num_blocks - headroom - used)
    return room


def first_admission_free(blocks: BlockManager) -> bool:
    """With nothing started, the first job admitted fits whatever the room says (no job
    is ever refused forever: fsd.admission already knows it fits the device)."""
    return blocks.device.num_used + blocks.host.num_used == 0


def predicted_latency(
    queue: JobQueue,
    cost: CostModel,
    job: Job,
    now: float,
    batch_size: int,
    pending: Sequence[tuple[Job, float]] = (),
) -> float:
    """Seconds per output token a queued `job` is predicted to see: its ENST (the
    paper's, plus the jobs ahead of it at its own level) spread over the tokens
    expected of it (its cap, or the learned mean if smaller), plus one decode step."""
    wait = queue.enst_fn(now, batch_size, pending)(job) + queue.level_backlog(job, batch_size)
    learned = queue.learned()
    tokens = float(max(job.max_output, 1))
    if learned is not None and learned.ready and learned.mean is not None:
        tokens = max(min(tokens, learned.mean), 1.0)
    return wait / tokens + cost.min_iteration_time


def skip_threshold(room: float, block_size: int) -> float:
    """The fewest tokens of a job without KV whose blocks exceed `room`.

    Its need is ceil((tokens + 1) / block_size) blocks, an integer, so need > room
    exactly when need > floor(room), that is when tokens >= floor(room) * block_size.
    """
    if room == math.inf:
        return math.inf
    return math.floor(room) * block_size
