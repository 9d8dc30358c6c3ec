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
from typing import Literal, NamedTuple, TypeVar

from fsd.jobs import PENDING, Job, SamplingParams
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
    # (index in input_ids, job id): a token the previous step is still drawing, taken
    # from that step's output on the device (scheduled one step ahead: fsd.engine.ahead)
    pending: tuple[tuple[int, str], ...] = ()
    # empty: block_tables are whole; else block_tables[k] is sequence k's table from
    # block table_starts[k] on (the worker keeps the rest: a persistent batch)
    table_starts: tuple[int, ...] = ()

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def has_model_step(self) -> bool:
        return bool(self.query_lens)


class TableMirror:
    """What a worker's persistent block tables (fsd.engine.block_tables) hold of each
    job, kept by the driver, so a plan carries only what changed: a job's new blocks,
    or its whole table when it changed other than by growing (`Job.table_epoch`)."""

    def __init__(self) -> None:
        self._sent: dict[str, tuple[int, int]] = {}  # job id -> (table epoch, blocks sent)

    def delta(self, job: Job) -> tuple[int, tuple[int, ...]]:
        """Where the job's table changes from, and its blocks from there on."""
        table, epoch = job.block_table, job.table_epoch
        sent = self._sent.get(job.job_id)
        start = sent[1] if sent is not None and sent[0] == epoch and sent[1] <= len(table) else 0
        self._sent[job.job_id] = (epoch, len(table))
        return start, tuple(table[start:])

    def forget(self, job_id: str) -> None:
        """The job's table is to be sent whole next time (it ended, or a plan was lost)."""
        self._sent.pop(job_id, None)


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
    mirror: TableMirror | None = None,
) -> StepPlan:
    """Lay out `batch` for one model step: one-token (decode) sequences first.

    Each job feeds its scheduled `step_tokens` from its first uncached one (all its
    new tokens, or a prefill chunk). Sync copies keep the scheduler's issue order: a
    later copy may write the blocks an earlier one read. With a `mirror`, the block
    tables carry only what changed since the worker last saw each job.
    """
    order = sorted(range(len(batch)), key=lambda i: batch[i].step_tokens > 1)
    cols = _columns([batch[i] for i in order], eos_ids, mirror)
    return StepPlan(
        seq=seq,
        input_ids=tuple(cols.input_ids),
        positions=tuple(cols.positions),
        query_lens=tuple(cols.query_lens),
        context_lens=tuple(cols.context_lens),
        block_tables=tuple(cols.block_tables),
        order=tuple(order),
        job_ids=tuple(cols.job_ids),
        params=tuple(cols.params),
        banned=tuple(cols.banned),
        samples=tuple(cols.samples),
        sync_swaps=tuple(SwapInstr.of(op) for op in sync_ops),
        async_swaps=tuple(SwapInstr.of(op) for op in async_ops),
        forget=tuple(forget),
        pending=tuple(cols.pending),
        table_starts=tuple(cols.table_starts),
    )


class _Columns(NamedTuple):
    """A plan's per-token and per-job lists, as `_columns` fills them."""

    input_ids: list[int]
    positions: list[int]
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[tuple[int, ...]]
    job_ids: list[str]
    params: list[SamplingParams]
    banned: list[tuple[int, ...]]
    samples: list[bool]
    table_starts: list[int]
    pending: list[tuple[int, str]]


def _columns(jobs: Sequence[Job], eos_ids: Collection[int], mirror: TableMirror | None) -> _Columns:
    """The columns of `jobs`, in their order, filled in one pass: this runs for every
    job of every step."""
    input_ids: list[int] = []
    positions: list[int] = []
    ends, lens, tables, ids, params, banned, samples = [], [], [], [], [], [], []  # per job
    starts: list[int] = []
    pending: list[tuple[int, str]] = []
    for job in jobs:
        start, n, total = job.num_computed_tokens, job.step_tokens, job.num_tokens
        end = start + n
        if end > total or end <= start:
            raise ValueError(f"{job.job_id}: scheduled tokens [{start}, {end}) outside its {total}")
        if n == 1 and end == total:  # a decode: its last token
            out = job.output_token_ids
            input_ids.append(out[-1] if out else job.prompt_token_ids[-1])
            positions.append(start)
        else:
            input_ids.extend(job.token_ids(start, end))
            positions.extend(range(start, end))
        if input_ids[-1] == PENDING:  # only the last token can still be on the device
            pending.append((len(input_ids) - 1, job.job_id))
        ends.append(end)
        lens.append(n)
        if mirror is None:
            tables.append(tuple(job.block_table))
        else:
            start, blocks = mirror.delta(job)
            starts.append(start)
            tables.append(blocks)
        ids.append(job.job_id)
        params.append(job.params)
        banned.append(banned_tokens(job, eos_ids))
        samples.append(end >= total)
    return _Columns(input_ids, positions, lens, ends, tables, ids, params, banned, samples, starts,
                    pending)  # fmt: skip


def unorder(plan: StepPlan, rows: Sequence[T]) -> list[T]:
    """Per-sequence results in the plan's order -> the scheduler's batch order."""
    out: list[T] = list(rows)
    for k, i in enumerate(plan.order):
        out[i] = rows[k]
    return out


def sub_plan(plan: StepPlan, keep: range) -> StepPlan:
    """The plan of sequences `keep` (positions in the plan's order) alone: the same
    step, so a failing sequence can be found without laying the jobs out again."""
    starts = [0]
    for n in plan.query_lens:
        starts.append(starts[-1] + n)
    lo, hi = starts[keep.start], starts[keep.stop]

    def pick(values: tuple) -> tuple:
        return values[keep.start : keep.stop] if values else ()

    return StepPlan(
        seq=plan.seq,
        input_ids=plan.input_ids[lo:hi],
        positions=plan.positions[lo:hi],
        query_lens=pick(plan.query_lens),
        context_lens=pick(plan.context_lens),
        block_tables=pick(plan.block_tables),
        order=tuple(range(len(keep))),
        job_ids=pick(plan.job_ids),
        params=pick(plan.params),
        banned=pick(plan.banned),
        samples=pick(plan.samples),
        pending=tuple((i - lo, job) for i, job in plan.pending if lo <= i < hi),
        table_starts=pick(plan.table_starts),
    )
