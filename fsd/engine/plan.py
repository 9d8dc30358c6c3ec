"""The step plan: what every distributed worker needs to run one micro-batch.

The driver (the engine process) keeps the scheduler, the block manager and the
jobs; workers see none of them. A `StepPlan` carries, as plain lists, exactly what a
model step reads -- the flat batch (decodes first, as `ModelRunner` lays it out),
positions, block tables -- and the swap instructions that travel with it. Every
worker receives the same plan; each applies it to its own shard (its heads, its
stage's layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from fsd.jobs import Job
from fsd.kv.swap import SwapOp


@dataclass(frozen=True)
class SwapInstr:
    """One planned copy, without the job: direction and block ids (src tier -> dst tier)."""

    direction: Literal["out", "in"]
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
    """One micro-batch: the flat token batch plus the swap copies that go with it.

    `order[k]` is the index in the scheduler's batch of the k-th sequence here.
    `banned` is set when every row is greedy: the last stage then returns token ids
    (argmax after banning) instead of logits, so only a few ints cross the wire.
    """

    seq: int
    input_ids: tuple[int, ...] = ()
    positions: tuple[int, ...] = ()
    query_lens: tuple[int, ...] = ()
    context_lens: tuple[int, ...] = ()
    block_tables: tuple[tuple[int, ...], ...] = ()
    order: tuple[int, ...] = ()
    sync_swaps: tuple[SwapInstr, ...] = ()
    async_swaps: tuple[SwapInstr, ...] = ()
    banned: tuple[tuple[int, ...], ...] | None = field(default=None)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def has_model_step(self) -> bool:
        return bool(self.query_lens)


@dataclass(frozen=True)
class FlatBatch:
    """A batch laid out for one model step: decodes (one new token) first."""

    order: tuple[int, ...]  # position in the batch of each laid-out job
    jobs: tuple[Job, ...]
    input_ids: tuple[int, ...]
    positions: tuple[int, ...]


def flatten(batch: Sequence[Job]) -> FlatBatch:
    """Every job's new tokens and their positions, decodes first (the layout the
    attention metadata and every worker expect)."""
    order = sorted(range(len(batch)), key=lambda i: batch[i].num_new_tokens > 1)
    jobs = [batch[i] for i in order]
    input_ids: list[int] = []
    positions: list[int] = []
    for job in jobs:
        start = job.num_computed_tokens
        input_ids.extend(job.all_token_ids[start:])
        positions.extend(range(start, job.num_tokens))
    return FlatBatch(tuple(order), tuple(jobs), tuple(input_ids), tuple(positions))


def build_plan(
    seq: int,
    batch: Sequence[Job],
    sync_ops: Sequence[SwapOp] = (),
    async_ops: Sequence[SwapOp] = (),
    banned: Sequence[tuple[int, ...]] | None = None,
) -> StepPlan:
    """Lay out `batch` as ModelRunner does: one-token (decode) sequences first.

    `banned`, given per job in batch order, asks for sampled ids instead of logits.
    """
    flat = flatten(batch)
    order, jobs = flat.order, flat.jobs
    return StepPlan(
        seq=seq,
        input_ids=flat.input_ids,
        positions=flat.positions,
        query_lens=tuple(j.num_new_tokens for j in jobs),
        context_lens=tuple(j.num_tokens for j in jobs),
        block_tables=tuple(tuple(j.block_table) for j in jobs),
        order=order,
        sync_swaps=tuple(SwapInstr.of(op) for op in sync_ops),  # in issue order
        async_swaps=tuple(SwapInstr.of(op) for op in async_ops),
        banned=None if banned is None else tuple(tuple(banned[i]) for i in order),
    )


def unorder(plan: StepPlan, rows: Sequence[int]) -> list[int]:
    """Per-sequence results in the plan's order -> the scheduler's batch order."""
    out = [0] * len(rows)
    for k, i in enumerate(plan.order):
        out[i] = rows[k]
    return out
