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
    from fsd.kv.policies import ArrivalEstimate


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
    ) -> list[SwapOp]:
        """Start the copies that keep `reserve` free and bring the next jobs in.

        `wanted`: host jobs the batch would have taken now; they come in first, may use
        the reserve, and room is made for them by evicting jobs expected later.
        `upcoming`: the host jobs next in line after the batch; they come in only while
        the reserve still holds.
        `by_enst`: yields the device-resident jobs outside the batch (the swap-out
        candidates) as (ENST, job), largest first, lazily (the queue knows which jobs
        can have a large ENST).
        """
        blocks = self.blocks
        ops: list[SwapOp] = []
        if not self.has_work(wanted, upcoming, in_flight, reserve):
            return ops
        moving = sum(op.num_blocks for op in in_flight.values())
        budget = float("inf") if max_blocks is None else max_blocks - moving
        if budget <= 0:
            return ops
        # each wanted job's room and ENST, read again by the swap-in loop below
        known = {j.job_id: (self._room_to_run(j), enst(j)) for j in wanted}
        urgent = sum([room for room, _ in known.values()])
        soonest = min([e for _, e in known.values()], default=float("inf"))
        freeing = sum(op.num_blocks for op in in_flight.values() if op.direction == "out")
        free_soon = blocks.num_free + freeing
        target = min(reserve + urgent, blocks.device.num_blocks)
        sent_out = float("inf")  # smallest ENST sent out this round
        candidates: Iterator[tuple[float, Job]] = iter(())
        if free_soon < target:
            candidates = by_enst()
        for e, job in candidates:
            if free_soon >= target or budget <= 0:
                break
            if free_soon >= reserve and e <= soonest:
                break  # past the reserve, evict only for jobs expected sooner than the victim
            if not blocks.can_swap_out(job):
                continue  # host tier full: the job keeps its device blocks
            n = blocks.freed_by(job)
            ops.append(blocks.swap_out(job))
            free_soon += n
            budget -= n
            sent_out = min(sent_out, e)
        for job, floor in itertools.chain(
            ((j, 0) for j in wanted), ((j, reserve) for j in upcoming)
        ):
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
        return ops

    def _room_to_run(self, job: Job) -> int:
        """Device blocks a host job needs to come in and run its next iteration."""
        return max(len(job.host_block_table), self.blocks.blocks_for(job.num_tokens))


def by_enst_desc(jobs: Iterable[Job], enst: Callable[[Job], float]) -> Iterator[tuple[float, Job]]:
    """(ENST, job) for `jobs`, largest ENST first (ties in the given order)."""
    return iter(sorted(((enst(j), j) for j in jobs), key=lambda ej: -ej[0]))
