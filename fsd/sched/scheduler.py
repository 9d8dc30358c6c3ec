"""The scheduler: a queue policy, a KV memory policy and the batch they produce.

Each iteration: promote starved jobs, walk the queue in priority order taking ready
jobs until the batch is full, make device room for them as the KV policy allows,
then (proactive policy) plan asynchronous swaps by ENST so that the jobs likely to
run next are already on the device and `reserve` blocks stay free for arrivals.

KV policies when device blocks run short (paper §4.2):
  defer      new jobs wait for free blocks (MLFQ degrades to FCFS under pressure);
             a device-resident job that must grow drops a lower job's KV
  recompute  drop lower-priority jobs' KV; they re-prefill later
  reactive   swap lower-priority jobs out, and chosen host jobs in, on the critical path
  proactive  keep a reserve free; swap out the largest ENST, swap in the smallest,
             asynchronously beside the model step; forced (synchronous) eviction only
             when the reserve did not suffice
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field

from fsd.config import CacheConfig, SchedConfig
from fsd.jobs import Job, JobStatus, KVLocation
from fsd.kv.block_manager import BlockManager
from fsd.kv.planner import SwapPlanner
from fsd.kv.swap import SwapOp
from fsd.sched.profile import CostModel
from fsd.sched.queues import JobQueue


@dataclass
class SchedulerOutput:
    """One iteration's decision: the batch, the copies to make, what changed."""

    batch: list[Job] = field(default_factory=list)
    swap_out: list[SwapOp] = field(default_factory=list)
    swap_in: list[SwapOp] = field(default_factory=list)
    sync: list[SwapOp] = field(default_factory=list)  # the synchronous ones, in issue order
    preempted: list[Job] = field(default_factory=list)  # ran last iteration, not this one
    recomputed: list[Job] = field(default_factory=list)  # KV dropped this iteration
    promoted: list[Job] = field(default_factory=list)
    demoted: list[Job] = field(default_factory=list)  # filled by update()

    @property
    def num_tokens(self) -> int:
        return sum(j.num_new_tokens for j in self.batch)

    @property
    def sync_ops(self) -> list[SwapOp]:
        """Copies that must end before the model step, to be made in this order.

        Each one's source blocks were freed when it was issued, so a later copy may
        write them (a swap-out into the host blocks a swap-in just left, or the
        reverse on the device): any other order can overwrite KV before it is read.
        """
        return list(self.sync)


class Scheduler:
    """Batch formation and KV placement over one queue policy."""

    def __init__(
        self,
        config: SchedConfig,
        cache: CacheConfig,
        blocks: BlockManager,
        cost: CostModel,
        make_queue: Callable[[SchedConfig, CostModel], JobQueue],
    ) -> None:
        self.config = config
        self.cache = cache
        self.blocks = blocks
        self.cost = cost
        self._make_queue = make_queue
        self.queue = make_queue(config, cost)
        self.planner = SwapPlanner(blocks, cache)
        self.reserve = 0  # blocks the proactive planner last kept free
        self.in_flight: dict[str, SwapOp] = {}
        self._jobs: dict[str, Job] = {}
        # jobs whose KV is wholly on one tier (not moving): the candidates for moves
        self._on_device: dict[str, Job] = {}
        self._on_host: dict[str, Job] = {}
        # ENST of the latest decision, built on first use (most iterations need none)
        self._enst_for: tuple[float, int] = (0.0, 1)
        self._enst_built: Callable[[Job], float] | None = None
        # jobs whose iteration came back since the last decision (with pipelining, the
        # batch before this one may still be in flight: it is not the one to compare)
        self._returned: set[str] = set()
        self._last_batch_cost = cost.min_iteration_time
        self._zombies: dict[str, Job] = {}  # removed while a copy of their KV was in flight
        self._victims: list[tuple[tuple, Job]] = []
        self._victims_for: SchedulerOutput | None = None

    @property
    def name(self) -> str:
        return self.queue.name

    def _locate(self, job: Job, where: KVLocation) -> None:
        """Set a job's KV location and keep the per-tier indexes in step."""
        job.kv = where
        self._on_device.pop(job.job_id, None)
        self._on_host.pop(job.job_id, None)
        if where is KVLocation.DEVICE:
            self._on_device[job.job_id] = job
        elif where is KVLocation.HOST:
            self._on_host[job.job_id] = job

    # ---- membership ------------------------------------------------------------

    def add(self, job: Job, now: float) -> None:
        self._jobs[job.job_id] = job
        self.queue.add(job, now)
        self.planner.observe_arrival(self.blocks.blocks_for(job.num_tokens + 1))

    def remove(self, job: Job) -> None:
        """Forget a finished or aborted job; its blocks return once no copy touches them."""
        self._jobs.pop(job.job_id, None)
        self.queue.remove(job)
        if job.job_id in self.in_flight:
            self._zombies[job.job_id] = job
            return
        self.blocks.free(job)
        self._locate(job, KVLocation.NONE)

    def jobs(self) -> Iterator[Job]:
        return iter(list(self._jobs.values()))

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def has_unfinished(self) -> bool:
        return bool(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def retune(
        self, now: float, config: SchedConfig | None = None, cache: CacheConfig | None = None
    ) -> None:
        """Change settings between iterations; no job is lost or restarted.

        Same policy: quanta, alpha and limits change in place (jobs keep their levels).
        Another policy: the jobs re-enter the new queue in their current order.
        """
        # what can fail comes before the first change: a refused retune changes nothing
        fresh = None if config is None else self._make_queue(config, self.cost)
        if cache is not None:
            self.cache = cache
            self.planner.cache = cache
        if config is None or fresh is None:  # (both or neither)
            return
        old, self.config = self.queue, config
        if fresh.name == old.name and old.adopt(fresh):
            return
        for job in list(old.ordered()):
            fresh.add(job, now)
        self.queue = fresh

    # ---- copies ------------------------------------------------------------------

    def swap_done(self, op: SwapOp) -> None:
        """The executor finished an asynchronous copy."""
        job = op.job
        self.in_flight.pop(job.job_id, None)
        if op.direction == "out":
            self.blocks.end_swap_out(op)
            self._locate(job, KVLocation.HOST)
        else:
            self.blocks.end_swap_in(op)
            self._locate(job, KVLocation.DEVICE)
        if self._zombies.pop(job.job_id, None) is not None:
            self.blocks.free(job)
            self._locate(job, KVLocation.NONE)

    def _start(self, op: SwapOp, out: SchedulerOutput) -> None:
        job = op.job
        if op.direction == "out":
            job.swaps_out += 1
            out.swap_out.append(op)
        else:
            job.swaps_in += 1
            out.swap_in.append(op)
        if op.sync:  # the executor completes it before the step: account it now
            out.sync.append(op)
            (self.blocks.end_swap_out if op.direction == "out" else self.blocks.end_swap_in)(op)
            self._locate(job, KVLocation.HOST if op.direction == "out" else KVLocation.DEVICE)
        else:
            self.in_flight[job.job_id] = op
            moving = KVLocation.SWAPPING_OUT if op.direction == "out" else KVLocation.SWAPPING_IN
            self._locate(job, moving)

    # ---- the iteration -------------------------------------------------------------

    def schedule(self, now: float, busy: Collection[str] = ()) -> SchedulerOutput:
        """Form the next batch. `busy`: jobs inside an unfinished (pipelined) micro-batch;
        they stay in their queues but are not ready, and their KV may not move."""
        out = SchedulerOutput(promoted=self.queue.tick(now))
        known = self._jobs
        self.queue.set_running(known[i] for i in self._returned if i in known)
        batch = out.batch
        # protected from eviction: this batch and the micro-batches still in flight
        batch_ids: set[str] = set(busy)
        budget = budget_all = self.config.max_batch_tokens
        wanted: list[Job] = []  # host jobs the batch would have taken
        upcoming: list[Job] = []  # host jobs next in line after a full batch
        evicted: set[str] = set()
        limit = self.config.max_batch_size
        scanned_after_full = 0
        batch_cost = 0.0  # sum(j.last_cost for j in batch): each job's iteration run alone
        prefills = 0
        too_big = 0  # prefills passed over for the token budget
        admit_room = self._admission_room()
        # the loop runs for every queued job each iteration: names are bound locally
        blocks, device, in_flight = self.blocks, self.blocks.device, self.in_flight
        bs = blocks.block_size
        job_time = self.cost.job_iteration_time
        step0, per_ctx = self.cost.decode_line()  # a decode step alone: step0 + per_ctx * ctx
        proactive = self.cache.kv_policy == "proactive"
        host, none, on_device = KVLocation.HOST, KVLocation.NONE, KVLocation.DEVICE
        running = JobStatus.RUNNING
        taken = 0  # len(batch), kept by hand: this test runs for every job walked
        wanted_full = False
        for job in self._candidates(admit_room):
            kv = job.kv
            if taken >= limit:
                # look a little further for the host jobs to bring in next (bounded)
                scanned_after_full += 1
                if scanned_after_full > 4 * limit or len(upcoming) >= limit:
                    break
                if kv is host:
                    upcoming.append(job)
                continue
            # A host job could only join `wanted`, which is full. (Its new work is one
            # token, so the budget checks below would not have ended the walk either.)
            if kv is host and wanted_full:
                continue
            num_tokens = job.num_tokens
            if kv is none:
                # the room is claimed in priority order even by a job that then cannot
                # start (device full, token budget spent): lower jobs must not take its share
                need = -(-(num_tokens + 1) // bs)
                if need > admit_room:
                    continue
                admit_room -= need
            job_id = job.job_id
            if job_id in in_flight or job_id in evicted or job_id in batch_ids:
                continue
            new_tokens = num_tokens - job.num_computed_tokens
            # More than one iteration allows (a job whose KV was dropped re-prefills every
            # token it has; a prompt queued before max_batch_tokens was lowered): it runs
            # alone rather than never.
            if new_tokens > budget and (taken or new_tokens <= budget_all):
                too_big += 1
                if too_big > 4 * limit:  # the budget is spent; do not walk the whole queue
                    break
                continue
            if kv is host:
                # the others copy it in now; defer and recompute hold host jobs only
                # after a live retune from a swapping policy, and must bring them back
                if proactive:
                    wanted.append(job)
                    wanted_full = len(wanted) >= 2 * limit
                    continue
                if not self._make_room(job, len(job.host_block_table), batch_ids, evicted, out):
                    continue
                self._start(blocks.begin_swap_in(job, sync=True), out)
            missing = -(-num_tokens // bs) - len(job.block_table)
            if missing > 0:
                if missing > device.num_free and not self._make_room(
                    job, missing, batch_ids, evicted, out
                ):
                    continue
                blocks.append(job, missing)
            if kv is not on_device and job.kv is not on_device:  # (a sync swap-in moved it)
                self._locate(job, on_device)
            if new_tokens > 1:
                job.last_cost = c = job_time(new_tokens, num_tokens)
                prefills += 1
            else:
                job.last_cost = c = step0 + per_ctx * num_tokens
            batch_cost += c
            job.last_prefill = new_tokens == num_tokens
            job.status = running
            batch.append(job)
            taken += 1
            batch_ids.add(job_id)
            budget -= new_tokens
        self._enst_for, self._enst_built = (now, limit), None
        if self.cache.kv_policy == "proactive":
            self._plan_proactive(batch_ids, wanted, upcoming, out)
        batch_ids.difference_update(busy)
        for job_id in self._returned - batch_ids - set(busy):
            job = self._jobs.get(job_id)
            if job is not None and not job.status.finished:
                job.preemptions += 1
                if job.status is running:
                    job.status = JobStatus.PREEMPTED
                out.preempted.append(job)
        self._returned = set()
        # a decision is made once per pipeline stage time: the copies beside one step
        self._last_batch_cost = max(
            self.cost.iteration_time_from_alone(batch_cost, taken - prefills, prefills),
            self.cost.min_iteration_time,
        ) / max(getattr(self.cost, "pipeline_stages", 1), 1)
        return out

    def _candidates(self, admit_room: float) -> Iterable[Job]:
        """The jobs to walk, in priority order.

        When admission lets no job without KV start, only the jobs holding KV can
        run; with a long queue of waiting jobs (10k) sorting those few beats walking
        the whole queue past thousands of jobs that would all be skipped.
        """
        if admit_room < 1:
            holders = len(self._on_device) + len(self._on_host)
            if 4 * holders < len(self._jobs):
                return sorted(
                    itertools.chain(self._on_device.values(), self._on_host.values()),
                    key=self.queue.key,
                )
        return self.queue.ordered()

    def _admission_room(self) -> float:
        """Blocks that jobs without KV may still take this iteration.

        Why: under overload, starting more jobs than device + host can hold means
        some started job must later drop its KV (recompute) with nowhere to go;
        capping what new jobs may take keeps the started ones whole. With nothing
        started, anything that fits is admitted (no job is ever refused forever).
        """
        blocks = self.blocks
        used = blocks.device.num_used + blocks.host.num_used
        if used == 0:
            return float("inf")
        total = blocks.device.num_blocks + blocks.host.num_blocks
        return self.cache.admit_fraction * total - used

    def _make_room(
        self,
        job: Job,
        need: int,
        protected: set[str],
        evicted: set[str],
        out: SchedulerOutput,
    ) -> bool:
        """Free device blocks for `job` by evicting lower-priority jobs, as the policy allows."""
        if need <= self.blocks.num_free:
            return True
        policy = self.cache.kv_policy
        if policy == "defer" and job.kv is not KVLocation.DEVICE:
            return False  # new jobs wait; only device-resident jobs may grow
        key = self.queue.key(job)
        victims = [
            v
            for k, v in self._victim_order(out)
            if k > key and v.block_table and v is not job and v.job_id not in protected
        ]
        # Plan before acting, so nothing is evicted for a job that still would not fit.
        # Dropping a started job's KV to admit a job that has none loops under load (the
        # dropped job is promoted later and drops another), so with swapping policies a
        # new job only ever displaces KV that can move to the host.
        may_drop = policy in ("defer", "recompute") or job.kv is KVLocation.DEVICE
        plan: list[tuple[Job, bool]] = []  # (victim, swap it rather than drop it)
        free, host_free = self.blocks.num_free, self.blocks.host.num_free
        for victim in victims:
            if free >= need:
                break
            n = len(victim.block_table)
            swap = policy in ("reactive", "proactive") and n <= host_free
            if not swap and not may_drop:
                continue
            plan.append((victim, swap))
            host_free -= n if swap else 0
            free += n
        if free < need:
            return False
        for victim, swap in plan:
            evicted.add(victim.job_id)
            if swap:
                self._start(self.blocks.begin_swap_out(victim, sync=True), out)
            else:
                self._drop(victim, out)
        return need <= self.blocks.num_free

    def _victim_order(self, out: SchedulerOutput) -> list[tuple[tuple, Job]]:
        """Device-resident jobs, lowest priority first, sorted once per schedule().

        Keys do not change within an iteration; jobs that leave the device since are
        skipped by `_make_room` (empty block table or no longer DEVICE).
        """
        if self._victims_for is not out:
            key = self.queue.key
            self._victims = sorted(
                ((key(v), v) for v in self._on_device.values()),
                key=lambda kv: kv[0],
                reverse=True,
            )
            self._victims_for = out
        return [(k, v) for k, v in self._victims if v.kv is KVLocation.DEVICE]

    def _drop(self, job: Job, out: SchedulerOutput) -> None:
        """Preempt by recomputation: the job's KV is gone; it re-prefills later."""
        self.blocks.free(job)
        job.num_computed_tokens = 0
        self._locate(job, KVLocation.NONE)
        job.recomputes += 1
        out.recomputed.append(job)

    def _plan_proactive(
        self, batch_ids: set[str], wanted: list[Job], upcoming: list[Job], out: SchedulerOutput
    ) -> None:
        reserve = self.reserve = self.planner.reserve_blocks(self.new_jobs_in_top_levels())
        if not self.planner.has_work(wanted, upcoming, self.in_flight, reserve):
            return
        # consumed only when the reserve is short (most iterations it is not)
        movable = (j for j in self._on_device.values() if j.job_id not in batch_ids)
        budget = self.planner.block_budget(self.cost, self._last_iteration_time())
        ops = self.planner.plan(
            movable,
            wanted,
            upcoming,
            self._enst,
            reserve,
            self.in_flight,
            budget,
            by_enst=lambda: self.queue.largest_enst_first(
                movable, self._on_device.keys() - batch_ids, self._enst
            ),
        )
        for op in ops:
            self._start(op, out)

    def _last_iteration_time(self) -> float:
        """The profiled time of the previous batch (the copies that fit beside a step)."""
        return self._last_batch_cost

    @property
    def _enst(self) -> Callable[[Job], float]:
        if self._enst_built is None:
            self._enst_built = self.queue.enst_fn(*self._enst_for)
        return self._enst_built

    def enst_of(self, job: Job) -> float:
        """The job's ENST under the latest scheduling decision (O(1))."""
        return self._enst(job)

    def refresh_enst(self) -> None:
        """Store every started job's ENST on it (for telemetry)."""
        for job in self._jobs.values():
            job.enst = self._enst(job) if job.kv is not KVLocation.NONE else None

    def new_jobs_in_top_levels(self) -> int:
        """Jobs without KV yet in the top K' queue levels (the burst predictor).

        Only these will need fresh blocks; counting stops at one batch's worth, since
        no more than that can start in the next iteration.
        """
        return self.queue.new_jobs_in_top_levels(
            self.cache.reserve_top_levels, self.config.max_batch_size
        )

    def update(self, out: SchedulerOutput, now: float) -> None:
        """Charge the iteration's service, demote, and release finished jobs."""
        ran: list[tuple[Job, float]] = []
        done: list[Job] = []
        finished = JobStatus.FINISHED
        for job in out.batch:
            if job.status is finished:
                done.append(job)
            else:
                ran.append((job, job.last_cost))
                self._returned.add(job.job_id)
        out.demoted = self.queue.account(ran, now)
        for job in done:
            self.remove(job)
