"""Batch formation: one walk of the queue in priority order (DESIGN §3, "Batch").

For each job in the order `fsd.sched.leads` gives: consider it (ready, not moving,
within the admission room unless it may pass it), chunk its prefill to what the
iteration has left, then grow its device blocks, evicting lower jobs' KV as the KV
policy allows. The room is claimed in priority order, so a lower job cannot take a
higher one's share. The walk also collects host jobs for the KV policy's copies
(`wanted`: the batch would have taken them; `upcoming`: next after a full batch).

Chunked prefill: an iteration carries at most `prefill_budget` prompt tokens, and no
more than the token budget leaves once every decode that can still join has its
token (decodes first, as in Sarathi-Serve): a burst of long prompts must not put a
chunk of each into one step. A chunk's boundary is a preemption point.

Under overload most queued jobs are waiting prompts over the room, which the loop
passes over as `_consider` would (held by tests/sched/test_walk_early_stop.py); once
no job may pass the room, the rest is filtered to the jobs that could still run
(`fsd.sched.waiting.could_run`; tests/sched/test_walk_narrowing.py). A waiting job's
cached prefix is attached only once it gets a step and room to grow (`_grow`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Iterator

from fsd.jobs import Job, JobStatus, KVLocation
from fsd.sched.chunking import chunk_share
from fsd.sched.decision import SchedulerOutput
from fsd.sched.leads import LOOK_AHEAD, first_for, leads_now, owner_leads
from fsd.sched.room import first_admission_free, skip_threshold
from fsd.sched.waiting import could_run
from fsd.sched.walk_context import WalkContext

_DEVICE, _HOST, _NONE = KVLocation.DEVICE, KVLocation.HOST, KVLocation.NONE
# host jobs the KV policy is asked to bring in, in batches: the next batch's and one more
WANTED_BATCHES = 2
_DONE, _FULL, _NARROW = object(), object(), object()  # how a walk's loop ended


class BatchWalk:
    """One iteration's walk and the batch it builds. Per job: consider (`_consider`:
    ready, and `_room_for` it), chunk (`_chunk_of`), grow or evict (`_grow`,
    `_make_room`, `_bring_in` for a host job), take (`_take`)."""

    def __init__(self, ctx: WalkContext, out: SchedulerOutput, busy: Collection[str]) -> None:
        self.ctx, self.out, self.limit = ctx, out, ctx.max_batch_size
        self.blocks = blocks = ctx.blocks
        # protected from eviction: this batch and the micro-batches still in flight
        self.batch_ids: set[str] = set(busy)
        self.budget = self.budget_all = ctx.max_batch_tokens
        self.admit_room = ctx.admit_room
        self.first_free = first_admission_free(blocks)  # nothing started yet
        self.leads = leads_now(ctx.queue, ctx.cost, blocks, ctx.rules)
        self.lead_ids: set[str] = set()  # the owners' leads walked first
        # a job without KV of this many tokens or more cannot be admitted now
        room = math.inf if self.first_free else self.admit_room
        self._skip_at = skip_threshold(room, blocks.block_size)
        self.wanted: list[Job] = []  # host jobs the batch would have taken
        self.upcoming: list[Job] = []  # host jobs next in line after a full batch
        self.wanted_full = False
        self.prefills = self._too_big = 0  # _too_big: prefills passed over for the budget
        self.evicted: set[str] = set()
        self.started: list[Job] = []  # the jobs without KV it started
        self.taken = 0  # len(batch), kept by hand: tested for every job walked
        self.batch_cost = 0.0  # sum(j.last_cost for j in batch): each job's iteration alone
        self._step0, self._per_ctx = ctx.cost.decode_line()  # decode alone: step0 + per_ctx*ctx
        self.chunk = ctx.prefill_budget  # 0: whole prefills
        self.prefill_left = self.chunk  # prompt tokens this iteration may still carry
        # a smaller piece is not worth a step (unless one iteration holds no more)
        self.min_chunk = min(blocks.block_size, self.budget_all)
        self.prefix = blocks.prefix.enabled
        # decodes that may still join (chunks leave them their tokens): at most a batch
        ready = itertools.islice(self._ready_decodes(busy), self.limit) if self.chunk else ()
        self.decodes_left = sum(1 for _ in ready)

    def _ready_decodes(self, skip: Collection[str]) -> Iterator[Job]:
        """Device jobs not in `skip` or moving whose next step is one token."""
        moving = self.blocks.moving
        for job_id, job in self.blocks.on_device.items():
            if job.num_new_tokens == 1 and job_id not in skip and job_id not in moving:
                yield job  # type: ignore[misc]

    def run(self, candidates: Iterable[Job]) -> None:
        """Walk `candidates` (priority order) until the batch is full or the walk ends.
        Passed over here: a job without KV over the room, and a host job once `wanted`
        is full; once no job may pass the room (`Leads.closed`), the rest is filtered
        in C to `could_run`'s jobs, where they are few against the queue."""
        ctx, leads = self.ctx, self.leads
        owners = ctx.waiting.owners.keys()
        first = [] if not leads.owners_may_lead(owners) else owner_leads(
            ctx.queue, ctx.waiting.newest.values(), leads, self.limit
        )  # fmt: skip
        self.lead_ids = {job.job_id for job in first}
        walk = itertools.chain(first, candidates)
        end = self._walk(walk, math.inf, False)
        while end is _NARROW:  # closed: the jobs that could still run, or again once fewer fit
            runnable = could_run(self.blocks, self.out.recomputed, ctx.waiting, self._skip_at)
            if runnable is None:
                end = self._walk(walk, self._skip_at, True)
            else:
                end = self._walk(filter(runnable.__contains__, walk), -math.inf, True)
        if end is _FULL:
            self._look_past_full(walk)
        if self.decodes_left and self.taken < self.limit:
            self._join_decodes()

    def _walk(self, stream: Iterator[Job], narrow_below: float, closed: bool) -> object:
        """`run`'s loop: how it ended (narrow once `closed` with the skip threshold under
        `narrow_below`: fewer jobs without KV fit the room)."""
        limit, leads = self.limit, self.leads
        owners = self.ctx.waiting.owners.keys()
        skip_at, wanted_full = self._skip_at, self.wanted_full
        for job in stream:
            kv = job.kv
            if kv is _NONE:
                if job.num_tokens >= skip_at and (closed or not leads.may_pass(job)):
                    continue
            elif kv is _HOST and wanted_full:
                leads.ahead = False  # as `_consider` would have noted
                continue
            if not self._consider(job):
                return _DONE
            if self.taken >= limit:  # (max_batch_size >= 1: never before the first job)
                return _FULL
            skip_at, wanted_full = self._skip_at, self.wanted_full
            if skip_at < narrow_below and not leads.ahead:
                if closed or leads.closed(owners):
                    return _NARROW
                narrow_below = -math.inf  # an owner without a started job may lead
        return _DONE

    def _admit(self, need: int) -> None:
        """Claim `need` blocks of the admission room, and move the skip threshold. The
        job starts: the jobs after it are not ahead of every started one."""
        self.admit_room = room = self.admit_room - need
        self.first_free = self.leads.ahead = False
        self._skip_at = skip_threshold(room, self.blocks.block_size)

    def _join_decodes(self) -> None:
        """Ready decodes the walk did not reach join, in priority order (decodes first)."""
        ready = list(self._ready_decodes(self.batch_ids))
        for job in sorted(ready, key=self.ctx.queue.key):
            if self.taken >= self.limit or not self.budget:
                return
            self._consider(job)

    def _look_past_full(self, rest: Iterator[Job]) -> None:
        """After a full batch, the host jobs among the next LOOK_AHEAD batches' worth."""
        limit, upcoming = self.limit, self.upcoming
        for job in itertools.islice(rest, LOOK_AHEAD * limit):
            if len(upcoming) >= limit:
                return
            if job.kv is _HOST:
                upcoming.append(job)

    def _room_for(self, job: Job) -> int:
        """The blocks a job without KV claims of the room (-1: it cannot start now)."""
        need = -(-(job.num_tokens + 1) // self.blocks.block_size)
        if need > self.admit_room and not self.first_free and not self.leads.may_pass(job):
            return -1
        return need

    def _consider(self, job: Job) -> bool:
        """Take `job` if it can run now; False when the walk should end."""
        if job.kv is not _NONE:
            self.leads.ahead = False  # a started job: the short jobs ahead of it are passed
            return self._consider_job(job, False)
        return self._consider_job(job, self.prefix and not job.num_computed_tokens)

    def _consider_job(self, job: Job, cached: bool) -> bool:  # cached: reuse its prefix
        kv = job.kv
        if kv is _HOST and self.wanted_full:  # it could only join `wanted`, which is full
            return True
        num_tokens = job.num_tokens
        if kv is _NONE:
            # the room is claimed in priority order even by a job that then cannot start
            # (device full, token budget spent): lower jobs must not take its share
            need = self._room_for(job)
            if need < 0:
                return True
            self._admit(need)
            self.leads.owners.add(job.owner)  # its owner's turn past the room is used
        job_id = job.job_id
        if job_id in self.blocks.moving or job_id in self.evicted or job_id in self.batch_ids:
            return True
        room = self._chunk_room() if cached and self.chunk else None
        # the prompt budget spent, only a prompt cached whole could run: no lookup
        cached = cached and not (room is not None and num_tokens > room < self.min_chunk)
        computed, held = self.blocks.prefix.plan(job) if cached else (job.num_computed_tokens, None)
        new_tokens = num_tokens - computed
        step = self._chunk_of(new_tokens, room) if self.chunk and new_tokens > 1 else new_tokens
        # more than one iteration allows (its KV dropped, it re-prefills every token; or
        # queued before max_batch_tokens was lowered): it runs alone rather than never
        if step > self.budget and (self.taken or step <= self.budget_all) or not step:
            self._too_big += 1  # the budget is spent once LOOK_AHEAD batches of them are
            return self._too_big <= LOOK_AHEAD * self.limit
        if kv is _HOST and not self._bring_in(job):
            return True
        if self._grow(job, computed + step, held):
            self._take(job, step, new_tokens, num_tokens)
            if kv is _NONE:
                self.started.append(job)
            elif step == 1 and kv is _DEVICE and self.decodes_left:
                self.decodes_left -= 1  # one of the decodes counted at the start
        return True

    def _chunk_of(self, new_tokens: int, room: int | None = None) -> int:
        """The prefill (chunk) a job takes now (0: none); `room`: `_chunk_room()`."""
        step = min(new_tokens, self._chunk_room() if room is None else room)
        return step if step >= new_tokens or step >= self.min_chunk else 0

    def _chunk_room(self) -> int:
        """Prompt tokens the iteration may still carry: the budgets less the decodes to come."""
        reserve = min(self.decodes_left, self.limit - self.taken - 1)
        return min(self.prefill_left, self.budget - max(reserve, 0))

    def _bring_in(self, job: Job) -> bool:
        """A host job's KV comes back now (synchronously), or later by the policy's plan."""
        if self.ctx.kv_policy.defers_host_jobs:
            self.wanted.append(job)
            self.wanted_full = len(self.wanted) >= WANTED_BATCHES * self.limit
            return False
        # defer and recompute hold host jobs only after a retune from a swapping policy
        if not self._make_room(job, len(job.host_block_table)):
            return False
        self.out.record(self.blocks.swap_in(job, sync=True))
        return True

    def _grow(self, job: Job, upto: int, held: int | None = None) -> bool:
        """Give the job the device blocks its first `upto` tokens need; False if no room.
        `held`: its cached prefix's device blocks, attached only once the growth can
        succeed: a job passed over leaves every cached block as it was."""
        blocks = self.blocks
        if held is not None:
            need = blocks.blocks_for(upto) - held
            if need > blocks.device.num_free and not self._make_room(job, need, dry=True):
                return False
            blocks.attach(job)
        missing = blocks.missing(job, upto)
        if missing:
            if missing > blocks.device.num_free and not self._make_room(job, missing):
                if held is not None:
                    blocks.detach(job)
                return False
            blocks.append(job, missing)
        elif job.kv is _NONE:  # its cached prefix holds every block it needs
            blocks.append(job, 0)
        return True

    def _make_room(self, job: Job, need: int, dry: bool = False) -> bool:
        """Evict lower jobs for `need` free device blocks (`dry`: only whether it could)."""
        ctx = self.ctx
        key = first_for(job, ctx.queue.key) if job.job_id in self.lead_ids else ctx.queue.key
        return ctx.evictor.make_room(
            job, need, ctx.kv_policy, key, self.batch_ids, self.evicted, self.out, dry
        )

    def _take(self, job: Job, step: int, new_tokens: int, num_tokens: int) -> None:
        if step > 1:
            start = job.num_computed_tokens
            c = self.ctx.cost.job_iteration_time(step, start + step)
            # the job's service: a chunk's share of its whole prefill, so chunks add up to
            # exactly what the whole prefill would have been charged (c for a whole one)
            whole = step == new_tokens == num_tokens
            job.last_cost = c if whole else chunk_share(self.ctx.cost, start, step)
            self.prefills += 1
            self.prefill_left -= step
        else:
            job.last_cost = c = self._step0 + self._per_ctx * num_tokens
        self.batch_cost += c
        # every chunk of a prefill is prefill (skip-join placed the job by the whole one)
        job.last_prefill = new_tokens == num_tokens or step > 1
        job.step_tokens = step
        job.status = JobStatus.RUNNING
        self.out.batch.append(job)
        self.taken += 1
        self.batch_ids.add(job.job_id)
        self.budget -= step
