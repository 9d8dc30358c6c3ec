"""Batch formation: one walk of the queue in priority order (DESIGN §3, "Batch").

A job is taken when it is ready (not moving, not in a micro-batch in flight), its
new tokens fit the iteration's token budget, and its KV is (or can be made) wholly
on the device as the KV policy allows. Admission caps what jobs without KV may
claim, in priority order, so a lower job cannot take a higher one's share. The walk
also collects host jobs to bring in (`wanted`: the batch would have taken them now;
`upcoming`: next in line after a full batch) for the KV policy's copies.

With chunked prefill (a prefill budget: `prefill_chunk`, or derived from the SLO by
fsd.sched.chunking) an iteration carries at most that many prompt tokens in all, and no more than the token budget leaves once every decode
that can still join has its token (decodes first: Sarathi-Serve's stall-free
batching). The walk hands them out in priority order: a prefill takes what is left,
as a chunk if its prompt does not fit. Why a budget per iteration, not per job: a
burst of long prompts would otherwise put one chunk of each into the same step, and
the running decodes would wait for all of them (bench/policies.py --chunks, burst).
A chunk gets device blocks up to its own end only; its boundary is a preemption
point like any iteration's. With chunking off the walk is exactly the one before it.

Short jobs ahead (fsd's swap gate only): the gate lets no job without KV start while
started work fills the device, so a short job that ranks first could wait behind
long started ones. A job without KV that comes before every started job in the walk
and has at most what decodes within the policy's waiting limit still to make
(`express_tokens`: the time after which the policy promotes a job that never
started, 8 SLOs for fsd), and less than every started job has left to its cap,
starts past the room: it ends about when the policy would have lifted it anyway, so
it sends a started job to host memory once at most, while long new jobs and
identical jobs, which would take turns through host memory, stay behind.

Owners without started work (fsd's swap gate only): owners take turns inside a level
(fair_share), but another client's started jobs can still fill the batch, and its
backlog can teach the length predictor that short prompts run long. A short job (as
above) whose owner has no started job is found at the head of its level and walked
first, one per owner and half a batch at most, past the admission room. With one
owner (the simulator, the offline API) this adds nothing: an owner without started
jobs means nothing started, and the walk's own order holds. (The incidents behind
both rules: docs/history.md.)

The walk runs for every queued job every iteration: its state is plain attributes
and its per-job steps are short methods. Under overload most queued jobs are waiting
prompts over the admission room; the loop passes over them itself, with no call and
nothing changed, exactly as considering them would (bit-identical decisions:
tests/sched/test_walk_early_stop.py holds it to the walk that considers every job).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING

from fsd.jobs import Job, JobStatus, KVLocation
from fsd.sched.admission import first_admission_free

if TYPE_CHECKING:
    from fsd.sched.decision import SchedulerOutput
    from fsd.sched.scheduler import Scheduler

_DEVICE, _HOST, _NONE = KVLocation.DEVICE, KVLocation.HOST, KVLocation.NONE


def walk_order(sched: Scheduler, admit_room: float) -> Iterable[Job]:
    """The jobs to walk, in priority order.

    When admission lets no job without KV start, only the jobs holding KV can run;
    with a long queue of waiting jobs (10k) sorting those few beats walking the
    whole queue past thousands of jobs that would all be skipped.
    """
    if admit_room < 1:
        on_device, on_host = sched.blocks.on_device, sched.blocks.on_host
        if 4 * (len(on_device) + len(on_host)) < len(sched):
            started = sorted(
                itertools.chain(on_device.values(), on_host.values()),  # type: ignore[arg-type]
                key=sched.queue.key,
            )
            return itertools.chain(_leads(sched), started)
    return sched.queue.ordered()


def express_tokens(sched: Scheduler) -> int:
    """Tokens a short job ahead may still have to make (module doc): what decodes
    within the policy's waiting limit; 0 without the swap gate or a waiting limit."""
    _, _, waiting = sched.queue.limits()
    step, _ = sched.cost.decode_line()
    if not sched.gated or not waiting or step <= 0:
        return 0
    return int(waiting / step)


def _express_now(sched: Scheduler) -> tuple[int, set[str | None]]:
    """`express_tokens`, and fewer than any started job has left to its cap; and the
    owners of the started jobs (when that bound is not 0)."""
    bound, owners = express_tokens(sched), set()
    if bound:
        blocks = sched.blocks
        for job in itertools.chain(blocks.on_device.values(), blocks.on_host.values()):
            bound = min(bound, job.max_output - job.num_output_tokens - 1)  # type: ignore[attr-defined]
            owners.add(job.owner)  # type: ignore[attr-defined]
    return bound, owners


def _leads(sched: Scheduler) -> list[Job]:
    """The jobs without KV that come before every started job, of the first few of the
    queue's order (a flood's level is not walked past them)."""
    leads = []
    for job in itertools.islice(sched.queue.ordered(), 4 * sched.config.max_batch_size):
        if job.kv is not _NONE:
            break
        leads.append(job)
    return leads


def _first_for(job: Job, key: Callable[[Job], tuple]) -> Callable[[Job], tuple]:
    """`key`, but `job` ranks above every job (what it may evict is any lower one)."""
    return lambda j: (-math.inf,) if j is job else key(j)


class BatchWalk:
    """The state of one iteration's walk and the batch it builds."""

    def __init__(self, sched: Scheduler, out: SchedulerOutput, busy: Collection[str]) -> None:
        self.sched = sched
        self.out = out
        self.blocks = sched.blocks
        self.kv_policy = sched.kv_policy
        self.limit = sched.config.max_batch_size
        # protected from eviction: this batch and the micro-batches still in flight
        self.batch_ids: set[str] = set(busy)
        self.budget = self.budget_all = sched.config.max_batch_tokens
        self.admit_room = sched.admission_room()
        self.first_free = first_admission_free(self.blocks)  # nothing started yet
        self.lead = True  # no started job walked yet: a short job may start (module doc)
        self.express, self.started_owners = _express_now(sched)
        self.lead_ids: set[str] = set()  # the owners' leads walked first (`_owner_leads`)
        # a job without KV of this many tokens or more cannot be admitted now
        self._skip_at = math.inf if self.first_free else _skip_threshold(
            self.admit_room, self.blocks.block_size
        )
        self.wanted: list[Job] = []  # host jobs the batch would have taken
        self.upcoming: list[Job] = []  # host jobs next in line after a full batch
        self.wanted_full = False
        self.evicted: set[str] = set()
        self.taken = 0  # len(batch), kept by hand: tested for every job walked
        self.batch_cost = 0.0  # sum(j.last_cost for j in batch): each job's iteration alone
        self.prefills = 0
        self._too_big = 0  # prefills passed over for the token budget
        self._step0, self._per_ctx = sched.cost.decode_line()  # decode alone: step0 + per_ctx*ctx
        self.chunk = sched.prefill_budget  # 0: whole prefills
        self.prefill_left = self.chunk  # prompt tokens this iteration may still carry
        # a smaller piece is not worth a step (unless one iteration holds no more)
        self.min_chunk = min(sched.cache.block_size, self.budget_all)
        self.prefix = self.blocks.prefix.enabled
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

        Two kinds of job are passed over here without a call, as `_consider` would
        pass them with nothing changed: a job without KV whose blocks exceed the
        admission room (the room only shrinks during a walk, so it never fits later in
        it), and a host job once `wanted` is full. Under overload these are most of
        the queue (thousands of waiting prompts), and the walk's cost is theirs: the
        loop reads two attributes of each and keeps its state in locals, which only
        `_consider` changes.
        """
        limit, walk = self.limit, itertools.chain(self._owner_leads(), candidates)
        skip_at, wanted_full = self._skip_at, self.wanted_full
        for job in walk:
            kv = job.kv
            if kv is _NONE:
                if job.num_tokens >= skip_at and not self._short_lead(job):
                    continue
            elif kv is _HOST and wanted_full:
                self.lead = False  # as `_consider` would have noted
                continue
            if not self._consider(job):
                break
            if self.taken >= limit:  # (max_batch_size >= 1: never before the first job)
                self._look_past_full(walk)
                break
            skip_at, wanted_full = self._skip_at, self.wanted_full
        if self.decodes_left and self.taken < self.limit:
            self._join_decodes()

    def _admit(self, need: int) -> None:
        """Claim `need` blocks of the admission room, and move the skip threshold. The
        job starts: the jobs after it are not ahead of every started one."""
        self.admit_room = room = self.admit_room - need
        self.first_free = self.lead = False
        self._skip_at = _skip_threshold(room, self.blocks.block_size)

    def _join_decodes(self) -> None:
        """Decodes first: the walk ended (prompts past the budget) before reaching some
        ready decodes; they join in priority order (at most a device's worth to sort)."""
        ready = list(self._ready_decodes(self.batch_ids))
        for job in sorted(ready, key=self.sched.queue.key):
            if self.taken >= self.limit or not self.budget:
                return
            self._consider(job)

    def _look_past_full(self, rest: Iterator[Job]) -> None:
        """After a full batch, note the host jobs to bring in next: those among the next
        4 x max_batch_size jobs of the walk (any kind counts), at most a batch of them."""
        limit, upcoming = self.limit, self.upcoming
        for job in itertools.islice(rest, 4 * limit):
            if len(upcoming) >= limit:
                return
            if job.kv is _HOST:
                upcoming.append(job)

    def _owner_leads(self) -> list[Job]:
        """Short jobs without KV whose owner has no started job, from the head of each
        level, in priority order, one per owner and half a batch at most (started work
        keeps the rest): walked first (module doc). None when nothing started (the
        walk's own order then holds) or without the swap gate."""
        owners, express = self.started_owners, self.express
        if not owners or not express:
            return []
        # where a job of such an owner waits: its level's head (its turn), or anywhere
        # for its latest job (an owner whose jobs finished has turns of its own at the
        # level, behind a flood's queued jobs that never run there)
        heads = itertools.chain(self.sched.queue.heads(4 * self.limit), self.sched.newest.values())
        found = [
            job for job in heads if job.kv is _NONE and job.owner not in owners
            and job.max_output - job.num_output_tokens <= express
        ]  # fmt: skip
        leads: dict[str | None, Job] = {}  # an owner's first, half a batch at most
        for job in sorted(found, key=self.sched.queue.key):
            if len(leads) >= max(1, self.limit // 2):
                break
            leads.setdefault(job.owner, job)
        self.lead_ids = {job.job_id for job in leads.values()}
        return list(leads.values())

    def _short_lead(self, job: Job) -> bool:
        """A job without KV ahead of every started one, or whose owner has none, short
        enough to start past the admission room (module doc)."""
        if not (self.lead or job.owner not in self.started_owners):
            return False
        return job.max_output - job.num_output_tokens <= self.express

    def _consider(self, job: Job) -> bool:
        """Take `job` if it can run now; False when the walk should end."""
        if job.kv is not _NONE:
            self.lead = False  # a started job: the short jobs ahead of it are passed
        if job.kv is _NONE and self.prefix and not job.num_computed_tokens:
            need = -(-(job.num_tokens + 1) // self.blocks.block_size)
            if need > self.admit_room and not self.first_free and not self._short_lead(job):
                # it cannot be admitted: its cached blocks are not touched (attaching
                # and giving them back would refresh their place in the LRU order and
                # change what is evicted later, unlike the walk that skips it)
                return True
            # its cached prefix is attached first (the step is what is left), and given
            # back if it does not run after all
            self.blocks.attach(job)
            go_on = self._consider_job(job)
            if job.job_id not in self.batch_ids and job.kv is _NONE:
                self.blocks.detach(job)
            return go_on
        return self._consider_job(job)

    def _consider_job(self, job: Job) -> bool:
        kv = job.kv
        # A host job could only join `wanted`, which is full. (Its new work is one token,
        # so the budget checks below would not have ended the walk either.)
        if kv is _HOST and self.wanted_full:
            return True
        num_tokens = job.num_tokens
        if kv is _NONE:
            # the room is claimed in priority order even by a job that then cannot start
            # (device full, token budget spent): lower jobs must not take its share
            need = -(-(num_tokens + 1) // self.blocks.block_size)
            if need > self.admit_room and not self.first_free and not self._short_lead(job):
                return True
            self._admit(need)
            self.started_owners.add(job.owner)  # its owner's turn past the room is used
        job_id = job.job_id
        if job_id in self.blocks.moving or job_id in self.evicted or job_id in self.batch_ids:
            return True
        new_tokens = num_tokens - job.num_computed_tokens
        step = self._chunk_of(new_tokens) if self.chunk and new_tokens > 1 else new_tokens
        # More than one iteration allows (a job whose KV was dropped re-prefills every
        # token it has; a prompt queued before max_batch_tokens was lowered): it runs
        # alone rather than never.
        if step > self.budget and (self.taken or step <= self.budget_all) or not step:
            self._too_big += 1
            return self._too_big <= 4 * self.limit  # the budget is spent: stop walking
        if kv is _HOST and not self._bring_in(job):
            return True
        if self._grow(job, job.num_computed_tokens + step):
            self._take(job, step, new_tokens, num_tokens)
            if step == 1 and kv is _DEVICE and self.decodes_left:
                self.decodes_left -= 1  # one of the decodes counted at the start
        return True

    def _chunk_of(self, new_tokens: int) -> int:
        """The prefill (chunk) a job takes now (0: none): what is left of the
        iteration's `prefill_chunk` and of the budget after the decodes that can still
        join this batch."""
        reserve = min(self.decodes_left, self.limit - self.taken - 1)
        step = min(new_tokens, self.prefill_left, self.budget - max(reserve, 0))
        return step if step >= new_tokens or step >= self.min_chunk else 0

    def _bring_in(self, job: Job) -> bool:
        """A host job's KV comes back now (synchronously), or later by the policy's plan."""
        if self.kv_policy.defers_host_jobs:
            self.wanted.append(job)
            self.wanted_full = len(self.wanted) >= 2 * self.limit
            return False
        # defer and recompute hold host jobs only after a live retune from a swapping
        # policy, and must bring them back
        if not self._make_room(job, len(job.host_block_table)):
            return False
        self.out.record(self.blocks.swap_in(job, sync=True))
        return True

    def _grow(self, job: Job, upto: int) -> bool:
        """Give the job the device blocks its first `upto` tokens need; False if no room."""
        missing = self.blocks.missing(job, upto)
        if missing:
            if missing > self.blocks.device.num_free and not self._make_room(job, missing):
                return False
            self.blocks.append(job, missing)
        elif job.kv is _NONE:  # its cached prefix holds every block it needs
            self.blocks.append(job, 0)
        return True

    def _make_room(self, job: Job, need: int) -> bool:
        key = self.sched.queue.key
        if job.job_id in self.lead_ids:  # an owner's lead may send any started job out
            key = _first_for(job, key)
        return self.sched.evictor.make_room(
            job, need, self.kv_policy, key, self.batch_ids, self.evicted, self.out
        )

    def _share(self, start: int, step: int) -> float:
        """prefill(start + step) - prefill(start): the chunk's part of the whole prefill."""
        prefill = self.sched.cost.prefill_time
        return prefill(start + step) - (prefill(start) if start else 0.0)

    def _take(self, job: Job, step: int, new_tokens: int, num_tokens: int) -> None:
        if step > 1:
            start = job.num_computed_tokens
            c = self.sched.cost.job_iteration_time(step, start + step)
            # the job's service: a chunk's share of its whole prefill, so chunks add up to
            # exactly what the whole prefill would have been charged (c for a whole one)
            job.last_cost = c if step == new_tokens == num_tokens else self._share(start, step)
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


def _skip_threshold(room: float, block_size: int) -> float:
    """The fewest tokens of a job without KV whose blocks exceed `room`.

    Its need is ceil((tokens + 1) / block_size) blocks, an integer, so need > room
    exactly when need > floor(room), that is when tokens >= floor(room) * block_size.
    """
    if room == math.inf:
        return math.inf
    return math.floor(room) * block_size
