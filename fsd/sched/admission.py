"""Admission: whether a request can ever run here, whether it may start now, and
whether an overloaded daemon takes it at all.

The engine (`Engine.add_request`), the simulator (`Simulator.check`) and the scenario
injector (`check_fits`) refuse the same requests with the same words: a job that
could never be scheduled would wait forever and hold its client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsd.errors import OverloadedError, PromptTooLongError
from fsd.jobs import Job
from fsd.kv.block_manager import BlockManager

if TYPE_CHECKING:
    from fsd.cost import CostModel
    from fsd.sched.queues import JobQueue
    from fsd.sched.scheduler import Scheduler

NO_CONTEXT_LIMIT = 1 << 62  # the simulator's model has no context length


@dataclass(frozen=True)
class RequestLimits:
    """What bounds one request: the model's context, one iteration, the device pool."""

    max_model_len: int
    max_batch_tokens: int
    device_blocks: int
    block_size: int
    prefill_chunk: int = 0  # chunked prefill: a prompt need not fit one iteration
    context_note: str = ""  # why the context is what it is, if not the model's positions

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


def check_request(
    prompt_len: int, max_tokens: int, limits: RequestLimits, clip: bool = True
) -> int:
    """The job's output bound (max_tokens clipped to the context); raise if it cannot run.

    A prompt must leave one token of context for output and, unless prefills are
    chunked, fit one iteration's token budget (its first prefill); prompt and output
    together must fit the device pool,
    since a running job's KV is wholly on the device. A job whose KV is later dropped
    re-prefills more than max_batch_tokens: the scheduler runs it alone.

    `clip` False refuses a max_tokens that does not fit the context after the prompt,
    naming the limit (a client's request, as vLLM's and OpenAI's APIs answer: a
    silently shorter reply reads as the model stopping); True cuts it to the context
    (offline `fsd.LLM`, scenarios, the simulator: "up to the context").
    """
    ctx = limits.max_model_len
    if prompt_len >= ctx:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens; the model's context is {ctx} "
            f"tokens{limits.context_note} and at least one must be left for output"
        )
    if not clip and prompt_len + max_tokens > ctx:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens and max_tokens is {max_tokens}: "
            f"{prompt_len + max_tokens} tokens, more than the model's context of {ctx} "
            f"tokens{limits.context_note}; ask for at most {ctx - prompt_len} output tokens"
        )
    if prompt_len > limits.max_batch_tokens and not limits.prefill_chunk:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens, more than max_batch_tokens "
            f"({limits.max_batch_tokens}) allows in one iteration"
        )
    max_output = min(max_tokens, ctx - prompt_len)
    need = limits.blocks_for(prompt_len + max_output)
    if need > limits.device_blocks:
        raise PromptTooLongError(
            f"prompt of {prompt_len} tokens plus {max_output} output tokens needs {need} KV "
            f"blocks; the device pool has {limits.device_blocks}"
        )
    return max_output


def admission_room(blocks: BlockManager, admit_fraction: float, headroom: int | None) -> float:
    """Blocks that jobs without KV may still take this iteration.

    Why: under overload, starting more jobs than device + host can hold means some
    started job must later drop its KV (recompute) with nowhere to go; capping what
    new jobs may take keeps the started ones whole. With nothing started, anything
    that fits is admitted (no job is ever refused forever). `headroom` (fsd's swap
    gate; None: off): started work fits the device itself, less that many blocks for
    a full batch to grow into; a start beyond it would send a started job to host
    memory, and back, for nothing the batch needed (fsd.kv.planner.SwapGate). Under
    the gate the bound holds from the first iteration: with nothing started the walk
    admits its first job whatever its size (`first_admission_free`), and the rest
    within the room, so a batch never starts more prompts than it can finish with.
    """
    used = blocks.device.num_used + blocks.host.num_used
    if used == 0 and headroom is None:
        return float("inf")
    room = admit_fraction * (blocks.device.num_blocks + blocks.host.num_blocks) - used
    if headroom is not None:
        room = min(room, blocks.device.num_blocks - headroom - used)
    return room


def first_admission_free(blocks: BlockManager) -> bool:
    """With nothing started, the first job admitted fits whatever the room says (no job
    is ever refused forever: `check_request` already knows it fits the device)."""
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


def refuse_late_job(sched: Scheduler, job: Job, now: float, late: float | None, slo: float) -> None:
    """Overload refusal (SchedConfig.refuse_late; None: off): raise OverloadedError when
    the job just queued is predicted to see more than `late` SLOs per output token."""
    if late is None:
        return
    per_token = sched.predicted_latency(job, now)
    if per_token > late * slo:
        raise OverloadedError(
            f"refused: {len(sched)} jobs queued, and this one is predicted to see "
            f"{per_token:.3g} s per output token, more than refuse_late = {late:g} x the "
            f"SLO of {slo:.3g} s; try again later"
        )
