"""Proactive swap planning (paper §4.2): reserve for arrivals, ENST-ordered moves.

Why ENST: swapping by priority alone thrashes, because a low-priority job can be
about to run (starvation promotion). ENST folds that in, so the jobs expected to
run soonest stay on (or come back to) the device and the rest wait in host memory.
Why a reserve: a burst of new jobs would otherwise have to evict reactively, on
the critical path; keeping room for max(K, jobs in the top K' queues) typical new
jobs lets them start at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fsd.config import CacheConfig
from fsd.jobs import Job
from fsd.kv.block_manager import BlockManager
from fsd.kv.swap import SwapOp

_EMA = 0.1  # weight of the newest arrival in the blocks-per-new-job estimate


class SwapPlanner:
    """Chooses asynchronous swap-outs and swap-ins for one iteration."""

    def __init__(self, blocks: BlockManager, cache: CacheConfig) -> None:
        self.blocks = blocks
        self.cache = cache
        self.expected_new_blocks = 1.0

    def observe_arrival(self, num_blocks: int) -> None:
        self.expected_new_blocks += _EMA * (num_blocks - self.expected_new_blocks)

    def reserve_blocks(self, top_level_jobs: int) -> int:
        """reserve = max(K, jobs in the top K' queues) x expected blocks per new job."""
        jobs = max(self.cache.reserve_min_jobs, top_level_jobs)
        return min(round(jobs * self.expected_new_blocks), self.blocks.device.num_blocks)

    def plan(
        self,
        movable: Sequence[Job],
        hosted: Sequence[Job],
        wanted: Sequence[Job],
        enst: Mapping[str, float],
        reserve: int,
        in_flight: Mapping[str, SwapOp],
    ) -> list[SwapOp]:
        """Start the copies that keep `reserve` free and bring back the soonest jobs.

        `movable`: device-resident jobs outside the batch; `hosted`: jobs on the host;
        `wanted`: host jobs the batch would have taken now (they come in first, even
        into the reserve, and room is made for them).
        """
        blocks = self.blocks
        ops: list[SwapOp] = []
        wanted_ids = {j.job_id for j in wanted}
        urgent = sum(len(j.host_block_table) for j in wanted if j.job_id not in in_flight)
        freeing = sum(op.num_blocks for op in in_flight.values() if op.direction == "out")
        target = min(reserve + urgent, blocks.device.num_blocks)
        out_enst = float("inf")
        free_soon = blocks.num_free + freeing
        for job in sorted(movable, key=lambda j: enst[j.job_id], reverse=True):
            if free_soon >= target:
                break
            if not blocks.can_swap_out(job):
                continue  # host tier full: the job keeps its device blocks
            free_soon += len(job.block_table)
            out_enst = min(out_enst, enst[job.job_id])
            ops.append(blocks.begin_swap_out(job))
        order = sorted(hosted, key=lambda j: (j.job_id not in wanted_ids, enst[j.job_id]))
        for job in order:
            if job.job_id in in_flight:
                continue
            need = len(job.host_block_table)
            urgent_job = job.job_id in wanted_ids
            fits = blocks.num_free - need >= (0 if urgent_job else reserve)
            # never bring back a job expected later than one just sent out (thrashing)
            if not fits or (not urgent_job and enst[job.job_id] >= out_enst):
                if urgent_job:
                    continue
                break
            ops.append(blocks.begin_swap_in(job))
        return ops
