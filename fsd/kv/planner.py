"""Proactive swap planning (paper §4.2): reserve for arrivals, ENST-ordered moves.

Why ENST: swapping by priority alone thrashes, because a low-priority job can be
about to run (starvation promotion). ENST folds that in, so the jobs expected to
run soonest stay on (or come back to) the device and the rest wait in host memory.
Why a reserve: a burst of new jobs would otherwise have to evict reactively, on
the critical path; keeping room for max(K, jobs in the top K' queues) typical new
jobs lets them start at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from fsd.jobs import Job
from fsd.kv.block_manager import BlockManager
from fsd.kv.swap import SwapOp

if TYPE_CHECKING:
    from fsd.config import CacheConfig
    from fsd.cost import CostModel


_EMA = 0.1  # weight of the newest arrival in the blocks-per-new-job estimate


class ArrivalEstimate:
    """Device blocks a typical new job needs (an EMA over arrivals), for the reserve.

    Kept by the scheduler across policy changes, so a retune to `proactive` starts
    with a warm estimate.
    """

    def __init__(self) -> None:
        self.blocks_per_job = 1.0

    def observe(self, num_blocks: int) -> None:
        self.blocks_per_job += _EMA * (num_blocks - self.blocks_per_job)


class SwapGate:
    """fsd's rule for sending a started job to host memory (the paper's planner sends
    out by ENST alone): only to make room for a job the batch wants now, and only when
    that pays.

    Why no swap for arrivals: past capacity, keeping a reserve free for arrivals sent
    started jobs out and brought them back, over and over (docs/scheduling.md).
    Under this rule admission stands in for the reserve (`Scheduler.admission_room`):
    new work starts only while started work fits the device (less a block of growth
    per batch slot, at most a quarter of the pool), so room for arrivals comes from
    jobs that finish. Sizing that headroom as the reserve (K typical new jobs) idled
    much of a small device on long prompts; letting arrivals park started jobs (each
    at most once, when the exchange below pays) added swaps and won nowhere.
    Why the exchange: moving victim v out so that u runs first changes the sum of
    completion times by about v's time left - u's time left (u stops waiting for v, v
    now waits for u), each read from the queue's learned lengths (`tokens_left`, in
    decode steps of the batch). The move costs the copy out and back at the host
    link's bandwidth, queued behind the copies already on the link, and a job sent
    out k times before is likely to be sent out again: its move is charged k + 1
    round trips (hysteresis). Unknown lengths: the queue's order decides.
    """

    def __init__(
        self,
        tokens_left: Callable[[Job], float | None],
        step_s: float,
        block_s: float,
        backlog_blocks: int,
    ) -> None:
        self.tokens_left = tokens_left
        self.step_s = step_s  # seconds per output token of a job in the batch
        self.block_s = block_s  # seconds one block takes over the host link, one way
        self.backlog_blocks = backlog_blocks  # blocks already queued on the link

    @classmethod
    def over(
        cls,
        blocks: BlockManager,
        tokens_left: Callable[[Job], float | None],
        step_s: float,
        swap_time: Callable[[int], float],
    ) -> SwapGate:
        """The gate for `blocks`'s link now: `swap_time(tokens)` is the profile's."""
        backlog = sum(op.num_blocks for op in blocks.moving.values())
        return cls(tokens_left, step_s, swap_time(blocks.block_size), backlog)

    def pays(self, victim: Job, for_job: Job) -> bool:
        """Whether `victim` may go out to make room for `for_job`."""
        gain, left = self.tokens_left(for_job), self.tokens_left(victim)
        if gain is None or left is None:
            return True
        round_trip = (self.backlog_blocks + 2 * len(victim.block_table)) * self.block_s
        return (left - gain) * self.step_s > round_trip * (1 + victim.swaps_out)

    def longest(self, jobs: Sequence[Job]) -> Job:
        """The job expected to run longest (unknown: the longest): if a move pays for
        it, it pays for the others."""
        return max(jobs, key=lambda j: float("inf") if (t := self.tokens_left(j)) is None else t)

    def took(self, blocks: int) -> None:
        """A copy of `blocks` was queued on the link."""
        self.backlog_blocks += blocks


class SwapPlanner:
    """Chooses asynchronous swap-outs and swap-ins for one iteration."""

    def __init__(self, blocks: BlockManager, cache: CacheConfig, arrivals: ArrivalEstimate) -> None:
        self.blocks = blocks
        self.cache = cache
        self.arrivals = arrivals

    def reserve_blocks(self, top_level_jobs: int) -> int:
        """reserve = max(K, jobs in the top K' queues) x expected blocks per new job."""
        jobs = max(self.cache.reserve_min_jobs, top_level_jobs)
        # at most half the pool: a reserve that crowds out the jobs that run makes the
        # planner swap them out as fast as they come back in (found by hypothesis)
        per_job = self.arrivals.blocks_per_job
        return min(round(jobs * per_job), self.blocks.device.num_blocks // 2)

    def block_budget(self, cost: CostModel, iteration_time: float) -> int | None:
        """Blocks the host link moves in about two iterations (None: unknown, unbounded).

        Planning more copies than the link can finish only makes jobs wait longer
        for their KV; the bound also keeps the planner's work per iteration small.
        """
        if cost.kv_bytes_per_token <= 0:
            return None
        tokens = 2.0 * iteration_time * cost.swap_bytes_per_s / cost.kv_bytes_per_token
        return max(1, int(tokens // self.blocks.block_size))

    def has_work(
        self,
        wanted: Sequence[Job],
        upcoming: Sequence[Job],
        in_flight: Mapping[str, SwapOp],
        reserve: int,
    ) -> bool:
        """False in the common case: nothing to bring in, nothing moving, the reserve holds."""
        return bool(wanted or upcoming or in_flight) or self.blocks.num_free < reserve

    def plan(
        self,
        wanted: Sequence[Job],
        upcoming: Sequence[Job],
        enst: Callable[[Job], float],
        reserve: int,
        in_flight: Mapping[str, SwapOp],
        max_blocks: int | None,
        by_enst: Callable[[], Iterator[tuple[float, Job]]],
        gate: SwapGate | None = None,
    ) -> list[SwapOp]:
        """Start the copies that keep `reserve` free and bring the next jobs in.

        `wanted`: host jobs the batch would have taken now; they come in first, may use
        the reserve, and room is made for them by evicting jobs expected later.
        `upcoming`: the host jobs next in line after the batch; they come in only while
        the reserve still holds.
        `by_enst`: yields the device-resident jobs outside the batch (the swap-out
        candidates) as (ENST, job), largest first, lazily (the queue knows which jobs
        can have a large ENST).
        `gate`: fsd's rule (SwapGate): jobs go out only for `wanted` jobs and only when
        that pays; the reserve is kept by admission, not by swaps (None: the paper's).
        """
        if not self.has_work(wanted, upcoming, in_flight, reserve):
            return []
        moving = sum(op.num_blocks for op in in_flight.values())
        budget = float("inf") if max_blocks is None else max_blocks - moving
        if budget <= 0:
            return []
        # each wanted job's room and ENST, read again by the swap-ins
        known = {j.job_id: (self._room_to_run(j), enst(j)) for j in wanted}
        ops, budget, sent_out = self._swap_outs(wanted, known, reserve, in_flight, by_enst, gate,
                                                budget)  # fmt: skip
        queue = itertools.chain(((j, 0) for j in wanted), ((j, reserve) for j in upcoming))
        self._swap_ins(ops, queue, known, enst, budget, sent_out, moving)
        return ops

    def _swap_outs(
        self,
        wanted: Sequence[Job],
        known: Mapping[str, tuple[int, float]],
        reserve: int,
        in_flight: Mapping[str, SwapOp],
        by_enst: Callable[[], Iterator[tuple[float, Job]]],
        gate: SwapGate | None,
        budget: float,
    ) -> tuple[list[SwapOp], float, float]:
        """Send out the jobs expected latest until the wanted jobs' room (and, without a
        gate, the reserve) will be free: (the copies, the budget left, the smallest ENST
        sent out)."""
        blocks = self.blocks
        ops: list[SwapOp] = []
        urgent = sum([room for room, _ in known.values()])
        for_job = gate.longest(wanted) if gate is not None and wanted else None
        keep = 0 if gate is not None else reserve  # what swap-outs keep free for arrivals
        soonest = min([e for _, e in known.values()], default=float("inf"))
        freeing = sum(op.num_blocks for op in in_flight.values() if op.direction == "out")
        free_soon = blocks.num_free + freeing
        target = min(keep + urgent, blocks.device.num_blocks)
        sent_out = float("inf")  # smallest ENST sent out this round
        if free_soon >= target:
            return ops, budget, sent_out
        for e, job in by_enst():
            if free_soon >= target or budget <= 0:
                break
            if free_soon >= keep and e <= soonest:
                break  # past the reserve, evict only for jobs expected sooner than the victim
            if not blocks.can_swap_out(job):
                continue  # host tier full: the job keeps its device blocks
            if for_job is not None and gate is not None and not gate.pays(job, for_job):
                continue
            n = blocks.freed_by(job)
            if gate is not None:
                gate.took(len(job.block_table))
            ops.append(blocks.swap_out(job))
            free_soon += n
            budget -= n
            sent_out = min(sent_out, e)
        return ops, budget, sent_out

    def _swap_ins(
        self,
        ops: list[SwapOp],
        queue: Iterable[tuple[Job, int]],
        known: Mapping[str, tuple[int, float]],
        enst: Callable[[Job], float],
        budget: float,
        sent_out: float,
        moving: int,
    ) -> None:
        """Bring in the `queue`'s (job, blocks to keep free) in order, onto `ops`, while
        they fit and were not expected later than a job just sent out."""
        blocks = self.blocks
        for job, floor in queue:
            if blocks.num_free - floor < 1:
                break  # no job fits (each needs a block); free blocks only shrink here
            need = len(job.host_block_table)
            if need > budget and (ops or moving):
                break  # (a job larger than the whole budget comes in alone: never stranded)
            # Room to run, not only to land: a job brought in without the block its next
            # token needs cannot run, and is the first the reserve sends out again.
            # Never bring back a job expected later than one just sent out (thrashing).
            room, e = known.get(job.job_id, (self._room_to_run(job), None))
            if blocks.num_free - room >= floor and (enst(job) if e is None else e) < sent_out:
                ops.append(blocks.swap_in(job))
                budget -= need

    def _room_to_run(self, job: Job) -> int:
        """Device blocks a host job needs to come in and run its next iteration."""
        return max(len(job.host_block_table), self.blocks.blocks_for(job.num_tokens))


def by_enst_desc(jobs: Iterable[Job], enst: Callable[[Job], float]) -> Iterator[tuple[float, Job]]:
    """(ENST, job) for `jobs`, largest ENST first (ties in the given order)."""
    return iter(sorted(((enst(j), j) for j in jobs), key=lambda ej: -ej[0]))
