"""The step plan: everything a worker needs to run one micro-batch, and nothing more.

The driver (the engine process) keeps the scheduler, the block manager and the
jobs; workers see none of them. A `StepPlan` carries, as plain values, exactly what
a model step reads -- the flat batch (decodes first), positions, block tables --
what the sampler needs per row (its parameters, its job id for a seeded
generator, the tokens it may not produce yet), the swap instructions that travel
with it, and the job ids whose sampling state can go. Every worker receives the
same plan, in process or on Ray; each applies it to its own shard (its heads, its
stage's layers).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from fsd.jobs import Job, SamplingParams
from fsd.kv.swap import SwapOp

T = TypeVar("T")


@dataclass(frozen=True)
class SwapInstr:
    """One planned copy, without the job: direction and block ids (src tier -> dst tier)."""

    direction: Literal["out", "in", "copy"]
    src: tuple[int, ...]
    dst: tuple[int, ...]

    @classmethod
    def of(cls, op: SwapOp) -> SwapInstr:
        return cls(op.direction, tuple(op.src), tuple(op.dst))

    def as_op(self, sync: bool) -> SwapOp:
        """A job-less SwapOp that fsd.engine.swapper.Swapper can execute."""
        return SwapOp(None, self.direction, list(self.src), list(self.dst), sync)


@dataclass(frozen=True)
class StepPlan:
    """One micro-batch: the flat token batch, its sampling rows and its swap copies.

    Per-sequence fields are in the plan's order (decodes first); `order[k]` is the
    index in the scheduler's batch of the k-th sequence here (see `unorder`).
    `forget`: jobs that ended, whose seeded generators the sampler drops first.
    """

    seq: int
    input_ids: tuple[int, ...] = ()
    positions: tuple[int, ...] = ()
    query_lens: tuple[int, ...] = ()
    context_lens: tuple[int, ...] = ()
    block_tables: tuple[tuple[int, ...], ...] = ()
    order: tuple[int, ...] = ()
    job_ids: tuple[str, ...] = ()
    params: tuple[SamplingParams, ...] = ()
    banned: tuple[tuple[int, ...], ...] = ()
    # False for a prefill chunk short of its prompt's end: no logits, no draw
    samples: tuple[bool, ...] = ()
    sync_swaps: tuple[SwapInstr, ...] = ()
    async_swaps: tuple[SwapInstr, ...] = ()
    forget: tuple[str, ...] = ()

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def has_model_step(self) -> bool:
        return bool(self.query_lens)


def banned_tokens(job: Job, eos_ids: Collection[int]) -> tuple[int, ...]:
    """Tokens that would end the job before its min_tokens."""
    if len(job.output_token_ids) >= job.params.min_tokens:
        return ()
    eos = () if job.params.ignore_eos else tuple(eos_ids)
    return eos + job.params.stop_token_ids


def build_plan(
    seq: int,
    batch: Sequence[Job],
    sync_ops: Sequence[SwapOp] = (),
    async_ops: Sequence[SwapOp] = (),
    eos_ids: Collection[int] = (),
    forget: Sequence[str] = (),
) -> StepPlan:
    """Lay out `batch` for one model step: one-token (decode) sequences first.

    Each job feeds its scheduled `step_tokens` from its first uncached one (all its
    new tokens, or a prefill chunk). Sync copies keep the scheduler's issue order: a
    later copy may write the blocks an earlier one read.
    """
    order = sorted(range(len(batch)), key=lambda i: batch[i].step_tokens > 1)
    jobs = [batch[i] for i in order]
    input_ids: list[int] = []
    positions: list[int] = []
    ends: list[int] = []
    for job in jobs:
        start = job.num_computed_tokens
        end = start + job.step_tokens
        if end > job.num_tokens or end <= start:
            raise ValueError(
                f"{job.job_id}: scheduled tokens [{start}, {end}) outside its {job.num_tokens}"
            )
        input_ids.extend(job.token_ids(start, end))
        positions.extend(range(start, end))
        ends.append(end)
    return StepPlan(
        seq=seq,
        input_ids=tuple(input_ids),
        positions=tuple(positions),
        query_lens=tuple(j.step_tokens for j in jobs),
        context_lens=tuple(ends),
        block_tables=tuple(tuple(j.block_table) for j in jobs),
        order=tuple(order),
        job_ids=tuple(j.job_id for j in jobs),
        params=tuple(j.params for j in jobs),
        banned=tuple(banned_tokens(j, eos_ids) for j in jobs),
        samples=tuple(j.step_samples for j in jobs),
        sync_swaps=tuple(SwapInstr.of(op) for op in sync_ops),
        async_swaps=tuple(SwapInstr.of(op) for op in async_ops),
        forget=tuple(forget),
    )


def unorder(plan: StepPlan, rows: Sequence[T]) -> list[T]:
    """Per-sequence results in the plan's order -> the scheduler's batch order."""
    out: list[T] = list(rows)
    for k, i in enumerate(plan.order):
        out[i] = rows[k]
    return out
