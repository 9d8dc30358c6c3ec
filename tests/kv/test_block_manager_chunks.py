"""Block accounting with partly prefilled jobs (chunked prefill).

A job prefilled chunk by chunk holds device blocks only up to the end of what it has
fed, so between iterations every job's table on its tier is exactly
ceil(filled / block_size) blocks, whatever moved it: chunks that grow it (`missing`
with `upto`), swaps out and in halfway through its prompt (synchronous, or
asynchronous until `swap_done`), a drop, a release while its copy is in flight. First
the block manager alone under random operations (a Hypothesis state machine), then the
real scheduler with `prefill_chunk` set over random arrivals (tests/sched/harness.py
runs it without a model).
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fsd.jobs import Job, KVLocation, SamplingParams
from fsd.kv.block_manager import BlockManager
from fsd.kv.swap import SwapOp
from fsd.sched.decision import SchedulerOutput
from fsd.sched.scheduler import Scheduler
from tests.sched import harness
from tests.sched.harness import drive, job_specs, make_jobs, scheduler

BS = 4
DEVICE, HOST = 24, 24
KV = ["defer", "recompute", "reactive", "proactive"]
POLICIES = ["fcfs", "priority", "mlfq", "sj-mlfq", "srpt"]

_NONE, _DEVICE, _HOST = KVLocation.NONE, KVLocation.DEVICE, KVLocation.HOST
_OUT, _IN = KVLocation.SWAPPING_OUT, KVLocation.SWAPPING_IN


def blocks_for(tokens: int, block_size: int = BS) -> int:
    return math.ceil(tokens / block_size)


def assert_tables_hold_only_filled_blocks(jobs, block_size: int) -> None:
    """Each job's KV where its location says, exactly ceil(filled / block) blocks."""
    for job in jobs:
        filled = blocks_for(job.num_computed_tokens, block_size)
        dev, host = len(job.block_table), len(job.host_block_table)
        where = (job.job_id, job.kv, job.num_computed_tokens, dev, host)
        if job.kv is _NONE:
            assert job.num_computed_tokens == 0 and dev == host == 0, where
        elif job.kv is _DEVICE:
            assert dev == filled > 0 and host == 0, where
        elif job.kv is _HOST:
            assert host == filled > 0 and dev == 0, where
        else:  # a copy in flight holds both tables
            assert dev == host == filled > 0, where


# ----------------------------------------------------------------------------- the block manager


class PartlyPrefilledBlocks(RuleBasedStateMachine):
    """Jobs fed chunk by chunk, moved between tiers and dropped at any point."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(DEVICE, BS, HOST)
        # the scheduler sets the prefix cache's sink each iteration; here its copies (a
        # cached block demoted to the host when a take evicts it) move no content
        self.bm.prefix.sink = lambda op: None
        self.live: dict[str, Job] = {}
        self.copies: dict[str, SwapOp] = {}  # asynchronous copies not yet done
        self.released: dict[str, Job] = {}  # released while their copy was in flight
        self.seq = 0

    def _pick(self, data: st.DataObject, ok) -> Job | None:
        ids = sorted(i for i, j in self.live.items() if ok(j))
        return self.live[data.draw(st.sampled_from(ids))] if ids else None

    def _ready(self, job: Job) -> bool:
        return job.job_id not in self.copies

    def _copying(self, op: SwapOp, to: list[int], moving: KVLocation) -> bool:
        """Checks a move that just started, whose destination table is `to`: only the
        blocks filled so far move, however far its prompt goes (those the destination
        caches already, the jobs sharing prefixes, are referenced there, not copied); an
        asynchronous copy is `moving` until `copy_done`. Whether it is one."""
        job = op.job
        assert len(op.src) == len(op.dst) <= blocks_for(job.num_computed_tokens) == len(to)
        if op.sync:  # (a move with nothing to copy ends at once)
            return False
        assert job.kv is moving
        self.copies[job.job_id] = op
        return True

    @rule(prompt=st.integers(1, 60), outputs=st.integers(1, 6))
    def arrive(self, prompt: int, outputs: int) -> None:
        self.seq += 1
        job = Job([3] * prompt, SamplingParams(max_tokens=outputs), job_id=f"j{self.seq}")
        self.live[job.job_id] = job

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def feed_a_chunk(self, data: st.DataObject) -> None:
        """The batch walk's grow: blocks up to the chunk's end, then the step fills them."""
        job = self._pick(data, lambda j: j.kv in (_NONE, _DEVICE) and self._ready(j))
        if job is None:
            return
        start = job.num_computed_tokens
        step = data.draw(st.integers(1, job.num_tokens - start))
        upto = start + step
        missing = self.bm.missing(job, upto)
        assert missing == max(0, blocks_for(upto) - len(job.block_table))
        if missing > self.bm.device.num_free:
            return  # no room: the walk would evict or pass it over
        self.bm.append(job, missing)
        assert job.kv is _DEVICE and len(job.block_table) == blocks_for(upto)
        job.num_computed_tokens = upto
        if upto == job.num_tokens:  # the step reached the end: a token is sampled
            job.output_token_ids.append(7)
            if len(job.output_token_ids) >= job.params.max_tokens:
                self._end(job)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), sync=st.booleans())
    def swap_out(self, data: st.DataObject, sync: bool) -> None:
        job = self._pick(data, lambda j: j.kv is _DEVICE and self._ready(j))
        if job is None or not self.bm.can_swap_out(job):
            return
        op = self.bm.swap_out(job, sync=sync)
        if self._copying(op, job.host_block_table, _OUT):
            assert set(op.src) <= set(job.block_table)
        else:
            assert job.kv is _HOST and not job.block_table

    @precondition(lambda self: self.live)
    @rule(data=st.data(), sync=st.booleans())
    def swap_in(self, data: st.DataObject, sync: bool) -> None:
        job = self._pick(data, lambda j: j.kv is _HOST and self._ready(j))
        if job is None or not self.bm.can_swap_in(job):
            return
        op = self.bm.swap_in(job, sync=sync)
        self._copying(op, job.block_table, _IN)

    @precondition(lambda self: self.copies)
    @rule(data=st.data())
    def copy_done(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.copies)))
        op = self.copies.pop(job_id)
        self.bm.swap_done(op)
        job = op.job
        if job_id in self.released:  # its blocks waited for the copy
            del self.released[job_id]
            assert job.kv is _NONE and not job.block_table and not job.host_block_table
        else:
            assert job.kv is (_HOST if op.direction == "out" else _DEVICE)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        """Recompute: the KV is gone and the job re-prefills (the evictor's `_drop`)."""
        job = self._pick(data, lambda j: j.kv in (_DEVICE, _HOST) and self._ready(j))
        if job is None:
            return
        self.bm.free(job)
        job.num_computed_tokens = 0
        assert job.kv is _NONE

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """The job ends at any point: aborted mid-prefill, even mid-copy."""
        job = self._pick(data, lambda j: True)
        if job is not None:
            self._end(job)

    def _end(self, job: Job) -> None:
        del self.live[job.job_id]
        self.bm.release(job)
        if job.job_id in self.copies:
            self.released[job.job_id] = job
            assert job.job_id in self.bm.moving
        else:
            assert not job.block_table and not job.host_block_table and job.kv is _NONE

    @invariant()
    def blocks_are_conserved_and_tables_exact(self) -> None:
        self.bm.check()
        assert_tables_hold_only_filled_blocks(self.live.values(), BS)
        assert set(self.bm.moving) == set(self.copies)
        on_device = {i for i, j in self.live.items() if j.kv is _DEVICE}
        on_host = {i for i, j in self.live.items() if j.kv is _HOST}
        assert set(self.bm.on_device) == on_device and set(self.bm.on_host) == on_host
        owners = [*self.live.values(), *self.released.values()]
        # (jobs share cached prefix blocks: a block counts once however many hold it)
        assert self.bm.device.num_used == len({b for j in owners for b in j.block_table})
        assert self.bm.host.num_used == len({b for j in owners for b in j.host_block_table})

    def teardown(self) -> None:
        for op in list(self.copies.values()):
            self.bm.swap_done(op)
        for job in list(self.live.values()):
            self.bm.release(job)
        self.bm.check()
        assert self.bm.device.num_free == DEVICE and self.bm.host.num_free == HOST


def test_block_accounting_of_partly_prefilled_jobs_under_random_operations():
    run_state_machine_as_test(
        PartlyPrefilledBlocks,
        settings=settings(max_examples=150, stateful_step_count=60, deadline=None),
    )


def test_a_chunk_needs_blocks_only_up_to_its_end():
    bm = BlockManager(8, 4, 8)
    job = Job([1] * 30, SamplingParams())
    assert bm.missing(job) == 8 and bm.missing(job, 1) == 1 and bm.missing(job, 9) == 3
    bm.append(job, bm.missing(job, 9))
    job.num_computed_tokens = 9
    assert len(job.block_table) == 3 and bm.num_free == 5
    assert bm.missing(job, 12) == 0 and bm.missing(job, 13) == 1 and bm.missing(job, 30) == 5
    op = bm.swap_out(job, sync=True)  # half its prompt: three blocks move, not eight
    assert len(op.dst) == 3 and bm.num_free == 8 and bm.host.num_free == 5
    bm.check()


# ----------------------------------------------------------------------------- the scheduler


def watch(sched: Scheduler, chunk: int, max_batch_tokens: int) -> list[int]:
    """Check every batch the scheduler forms; returns the partial chunks' sizes."""
    schedule = sched.schedule
    bs = sched.blocks.block_size
    partial: list[int] = []

    def checked(now: float, busy=()) -> SchedulerOutput:
        out = schedule(now, busy)
        prompt_tokens = 0
        for job in out.batch:
            start, step = job.num_computed_tokens, job.step_tokens
            assert step >= 1 and start + step <= job.num_tokens
            # its device blocks reach the end of this step's tokens, and no further
            assert len(job.block_table) == blocks_for(start + step, bs), job.job_id
            if step > 1:
                prompt_tokens += step
            if start + step < job.num_tokens:  # a chunk short of the end
                partial.append(step)
                assert step >= min(bs, max_batch_tokens)
        assert prompt_tokens <= chunk
        assert sum(j.step_tokens for j in out.batch) <= max_batch_tokens or len(out.batch) == 1
        return out

    sched.schedule = checked  # type: ignore[method-assign]
    return partial


@settings(max_examples=200, deadline=None)
@given(
    job_specs(60, 12, 12),
    st.sampled_from(POLICIES),
    st.sampled_from(KV),
    st.sampled_from([4, 5, 8, 13, 32]),
    st.integers(1, 4),
    st.integers(10, 40),
    st.integers(0, 3),
    st.sampled_from([16, 24, 64]),
)
def test_property_chunked_prefill_conserves_blocks_and_finishes_everything(
    specs, policy, kv, chunk, batch, device, delay, max_batch_tokens
):
    # (mlfq and sj-mlfq demote at every quantum's end, with no preemption threshold)
    s = harness.property_scheduler(
        policy, kv, device, batch, prefill_chunk=chunk, max_batch_tokens=max_batch_tokens
    )
    assert s.blocks.block_size == BS
    # a prompt and its output must fit the device pool (admission's rule, drive_all); with
    # chunking, a prompt need not fit one iteration's token budget
    partial = watch(s, chunk, max_batch_tokens)
    check = lambda it, now: assert_tables_hold_only_filled_blocks(s.jobs(), BS)  # noqa: E731
    jobs = harness.drive_all(s, specs, copy_delay=delay, before=check)  # all end, blocks free
    assert all(len(j.output_token_ids) == j.max_output for j in jobs)
    if any(j.num_prompt_tokens > min(chunk, max_batch_tokens) for j in jobs):
        assert partial  # some prompt went in as chunks


@pytest.mark.parametrize("kv", KV)
def test_many_random_arrivals_with_aborts_mid_prefill(kv):
    """150 jobs arrive at random on a small pool; some are aborted between iterations,
    partly prefilled or while their KV is being copied."""
    rng = random.Random(f"chunks-{kv}")
    device = 40
    s = scheduler(
        "mlfq",  # every job starts on top: a new one cuts in ahead of a half-done prompt
        kv,
        device=device,
        host=120,
        max_batch_size=6,
        block_size=BS,
        prefill_chunk=12,
        max_batch_tokens=32,
    )
    specs = [(rng.randint(1, 90), rng.randint(1, 40)) for _ in range(150)]
    jobs = make_jobs([(p, o) for p, o in specs if blocks_for(p + o) <= device])
    arrivals = {j.job_id: rng.randint(0, 600) for j in jobs}
    partial = watch(s, 12, 32)
    aborted: list[Job] = []
    seen = {"partial": 0, "moving": 0, "host": 0, "dropped": 0}
    last: dict[str, int] = {}  # computed tokens at the previous look

    def between(it: int, now: float) -> None:
        live = list(s.jobs())
        assert_tables_hold_only_filled_blocks(live, BS)
        for job in live:
            computed = job.num_computed_tokens
            if 0 < computed < job.num_prompt_tokens:
                seen["partial"] += 1
                seen["moving"] += job.job_id in s.blocks.moving
                seen["host"] += job.kv is _HOST
            before = last.get(job.job_id, 0)
            if computed == 0 and 0 < before < job.num_prompt_tokens:
                seen["dropped"] += 1
                assert job.recomputes > 0
            last[job.job_id] = computed
        if live and rng.random() < 0.03:
            job = rng.choice(live)
            s.remove(job)  # the engine's abort between iterations
            aborted.append(job)

    run = drive(s, jobs, arrivals, copy_delay=2, before=between)
    done = {j.job_id for j in aborted}
    assert sorted(run.finished + sorted(done)) == sorted(j.job_id for j in jobs)
    for job in jobs:
        if job.job_id not in done:
            assert len(job.output_token_ids) == job.max_output
        assert not job.block_table and not job.host_block_table
    s.blocks.check()
    assert s.blocks.device.num_free == device and s.blocks.host.num_free == 120
    assert partial and seen["partial"] > 0 and aborted
    if kv in ("reactive", "proactive"):
        assert seen["host"] > 0 and sum(j.swaps_out for j in jobs) > 0  # partly prefilled KV moved
        if kv == "proactive":
            assert seen["moving"] > 0
    else:
        assert seen["dropped"] > 0  # partly prefilled KV was dropped
