"""The scheduler: a queue policy and a KV policy, and the batch they produce.

Each iteration: promote starved jobs, walk the queue in priority order (fsd.sched.batch,
evicting as the KV policy allows), then let the KV policy plan its copies beside the
step. Where each job's KV is belongs to the block manager; the scheduler uses its verbs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING

from fsd.cost import CostModel
from fsd.cost.calibration import LiveCost
from fsd.jobs import Job, JobStatus, KVLocation
from fsd.kv.block_manager import BlockManager
from fsd.kv.prefix_types import CopyBeatsRecompute
from fsd.kv.registry import ArrivalEstimate, make_kv_policy
from fsd.kv.swap import SwapOp
from fsd.sched.batch import BatchWalk
from fsd.sched.chunking import prefill_budget
from fsd.sched.copies import plan_inputs
from fsd.sched.decision import SchedulerOutput, SchedulerStats
from fsd.sched.estimates import Estimates
from fsd.sched.eviction import Evictor
from fsd.sched.leads import walk_order
from fsd.sched.queues import JobQueue
from fsd.sched.room import admission_room
from fsd.sched.waiting import WaitingIndex
from fsd.sched.walk_context import WalkContext

if TYPE_CHECKING:
    from fsd.config import CacheConfig, SchedConfig
    from fsd.sched.rules import WalkRules


class Scheduler:
    """Batch formation over one queue policy and one KV policy."""

    def __init__(
        self,
        config: SchedConfig,
        cache: CacheConfig,
        blocks: BlockManager,
        cost: CostModel,
        make_policy: Callable[[SchedConfig, CostModel], tuple[JobQueue, WalkRules]],
    ) -> None:
        """`make_policy` comes from the policy registry (make_scheduler): a config's
        queue and what the walk reads of its rules, given, not looked up here."""
        self.config = config
        self.cache = cache
        self.blocks = blocks
        self.cost = cost
        self._stages = max(getattr(cost, "pipeline_stages", 1), 1)
        self._make_policy = make_policy
        self.queue, self.rules = make_policy(config, cost)
        # prompt tokens one iteration may carry (0: whole prefills)
        self.prefill_budget = prefill_budget(config.prefill_chunk, cost, cache.block_size)
        self.arrivals = ArrivalEstimate()
        self.kv_policy = make_kv_policy(blocks, cache, cost, self.arrivals)
        self.evictor = Evictor(blocks)
        self._prefix_settings(cache)
        self._jobs: dict[str, Job] = {}
        self.estimates = Estimates(cost)
        self._returned: set[str] = set()  # came back since the last decision (pipelines)
        self._last_batch_cost = cost.min_iteration_time
        self.waiting = WaitingIndex(self._jobs)  # what the walk looks up (batch.py)
        self.live_cost = LiveCost()  # measured over profiled seconds (the engine reports)

    # ---- membership ------------------------------------------------------------

    def _prefix_settings(self, cache: CacheConfig) -> None:
        prefix, cost, bs = self.blocks.prefix, self.cost, cache.block_size
        if prefix.enabled and not cache.prefix_cache:
            prefix.clear()
        prefix.enabled = cache.prefix_cache
        # a host run comes back by copy when that beats recomputing it (both on the profile)
        prefix.worth_copy = CopyBeatsRecompute(cost, bs)

    def add(self, job: Job, now: float) -> None:
        self._jobs[job.job_id] = job
        self.waiting.add(job)
        if not job.num_computed_tokens:  # skip-join places it by the prefill it will do
            job.prefix_hint = self.blocks.prefix.peek(job)
        self.queue.add(job, now)
        self.estimates.first_tokens.arrived(job, now)
        # the reserve: blocks a new job takes, shared ones counted once (not its own)
        hint_blocks = job.prefix_hint // self.blocks.block_size
        self.arrivals.observe(self.blocks.blocks_for(job.num_tokens + 1) - hint_blocks)

    def remove(self, job: Job) -> None:
        """Forget a finished or aborted job; its blocks return once no copy touches them."""
        if self._jobs.pop(job.job_id, None) is None:  # gone already: nothing to do
            return
        self.estimates.forget(job)
        self.waiting.remove(job)
        self.queue.remove(job)
        self.blocks.release(job)

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
        """Change settings between iterations; no job is lost or restarted. Same policy:
        its settings change in place; another: the jobs re-enter it in their order."""
        config = None if config == self.config else config  # the same settings: a no-op
        cache = None if cache == self.cache else cache
        # what can fail comes before the first change: a refused retune changes nothing
        fresh, rules = (None, self.rules) if config is None else self._make_policy(config, self.cost)
        if cache is not None:
            self.cache = cache
            self._prefix_settings(cache)
            self.kv_policy = make_kv_policy(self.blocks, cache, self.cost, self.arrivals)
        if config is None or fresh is None:  # (both or neither)
            return
        old, self.config = self.queue, config
        self.rules = rules
        self.prefill_budget = prefill_budget(config.prefill_chunk, self.cost, self.cache.block_size)
        if fresh.name == old.name and old.adopt(fresh):
            return
        for job in list(old.ordered()):
            fresh.add(job, now)
        self.queue = fresh

    def swap_done(self, op: SwapOp) -> None:
        """The executor finished an asynchronous copy."""
        self.blocks.swap_done(op)

    # ---- the iteration -------------------------------------------------------------

    def schedule(self, now: float, busy: Collection[str] = ()) -> SchedulerOutput:
        """Form the next batch. `busy`: jobs inside an unfinished (pipelined) micro-batch;
        they stay in their queues but are not ready, and their KV may not move."""
        out = SchedulerOutput(promoted=self.queue.tick(now))
        self.blocks.prefix.sink = out.record  # the cache's copies, in issue order
        known = self._jobs
        self.queue.set_running(known[i] for i in self._returned if i in known)
        # 1. walk the queue in priority order, taking ready jobs until the batch is full
        walk = BatchWalk(self._walk_context(), out, busy)
        room = math.inf if walk.first_free else walk.admit_room
        limit = self.config.max_batch_size
        walk.run(walk_order(self.queue, self.blocks, len(self), room, limit))
        self.waiting.started(walk.started)
        # 2. the KV policy's asynchronous copies beside the step
        self.estimates.decided(now, self.config.max_batch_size)
        top = (self.cache.reserve_top_levels, self.config.max_batch_size)
        inputs = plan_inputs(
            walk, self.queue, self.blocks, self.cost, self.estimates.enst(self.queue),
            self._last_batch_cost, self.rules.swap_gate, top,
        )  # fmt: skip
        for op in self.kv_policy.plan(inputs):
            out.record(op)
        # 3. the jobs that ran last time and not now are preempted
        self.waiting.dropped(out.recomputed)
        self._mark_preempted(out, walk.batch_ids, busy)
        # 4. a decision is made once per pipeline stage time: the copies beside one step
        alone = self.cost.iteration_time_from_alone(
            walk.batch_cost, walk.taken - walk.prefills, walk.prefills
        )
        self._last_batch_cost = max(alone, self.cost.min_iteration_time) / self._stages
        return out

    def _walk_context(self) -> WalkContext:
        config = self.config
        return WalkContext(
            self.queue, self.blocks, self.kv_policy, self.evictor, self.cost, self.rules,
            config.max_batch_size, config.max_batch_tokens, self.prefill_budget,
            self.admission_room(), self.waiting,
        )  # fmt: skip

    def _mark_preempted(self, out: SchedulerOutput, ran: set[str], busy: Collection[str]) -> None:
        for job_id in self._returned - ran - set(busy):
            job = self._jobs.get(job_id)
            if job is not None and not job.status.finished:
                out.mark_preempted(job)
        self._returned = set()

    def admission_room(self) -> float:
        """Blocks that jobs without KV may still take this iteration (fsd.sched.room)."""
        slots = self.config.max_batch_size if self.rules.swap_gate else None
        return admission_room(self.blocks, self.cache.admit_fraction, slots)

    def predicted_latency(self, job: Job, now: float) -> float:
        """Seconds per output token a queued job is predicted to see (fsd.admission)."""
        return self.estimates.latency(self.queue, job, now, self.config.max_batch_size)

    def predicted_wait(self, job: Job, now: float) -> float | None:
        """Seconds a job just queued will wait for a first token (fsd.sched.first_tokens)."""
        return self.estimates.first_tokens.predicted(job, now)

    def enst_of(self, job: Job) -> float:
        """The job's ENST under the latest scheduling decision (O(1))."""
        return self.estimates.enst(self.queue)(job)

    def refresh_enst(self) -> None:
        """Store every started job's ENST on it (for telemetry)."""
        for job in self._jobs.values():
            job.enst = self.enst_of(job) if job.kv is not KVLocation.NONE else None

    def stats(self, with_levels: bool = True) -> SchedulerStats:
        """The policy's figures; `with_levels` False leaves the levels' job lists out."""
        return SchedulerStats.of(self.queue, self.kv_policy.reserve, self.live_cost, with_levels)

    @property
    def predicted_iteration_time(self) -> float:
        """The profile's time for the batch just formed, through every pipeline stage."""
        return self._last_batch_cost * self._stages

    def observe_iteration(self, predicted_s: float, measured_s: float) -> None:
        """A predicted iteration took `measured_s`: service is charged x the learned ratio
        from now on (fsd.cost.calibration)."""
        self.live_cost.observe(predicted_s, measured_s)

    def update(self, out: SchedulerOutput, now: float) -> None:
        """Charge the iteration's service (each job its iteration alone, x the live cost
        scale: 1.0 in the simulator), demote, and release finished jobs."""
        ran: list[tuple[Job, float]] = []
        done: list[Job] = []
        finished = JobStatus.FINISHED
        scale = self.live_cost.scale
        commit, device = self.blocks.prefix.commit, KVLocation.DEVICE
        started = self.estimates.first_tokens.ran
        for job in out.batch:
            if job.kv is device:  # name its newly computed blocks (a finished job's too)
                commit(job, job.block_table)
            started(job, now)
            if job.status is finished:
                done.append(job)
            else:
                ran.append((job, job.last_cost * scale))
                self._returned.add(job.job_id)
                if job.step_tokens > 1:  # a prefill or a chunk of one
                    self.estimates.prefilled(job)
        self.queue.live_scale = scale  # what the charged seconds are in profile seconds
        if out.recomputed:
            self.queue.dropped(out.recomputed)
        out.demoted = self.queue.account(ran, now)
        for job in done:
            self.remove(job)

