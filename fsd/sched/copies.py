"""What the KV policy is given to plan its asynchronous copies beside a step: the
walk's host jobs, the burst predictor, ENST, the last batch's time and, under fsd's
swap gate, the rule that a job goes to host memory only when that pays."""

from __future__ import annotations

from collections.abc import Callable

from fsd.cost import CostModel
from fsd.jobs import Job
from fsd.kv.block_manager import BlockManager
from fsd.kv.planner import SwapGate
from fsd.kv.policies import PlanInputs
from fsd.sched.batch import BatchWalk
from fsd.sched.queues import JobQueue


def plan_inputs(
    walk: BatchWalk,
    queue: JobQueue,
    blocks: BlockManager,
    cost: CostModel,
    enst: Callable[[Job], float],
    last_batch_cost: float,
    gated: bool,
    top_levels: tuple[int, int],
) -> PlanInputs:
    """`top_levels`: (K', max batch size) of the burst predictor: jobs without KV yet in
    the top K' levels will need fresh blocks, at most a batch of them next iteration."""
    batch_ids, on_device = walk.batch_ids, blocks.on_device
    movable = (j for j in on_device.values() if j.job_id not in batch_ids)

    def swap_gate() -> SwapGate | None:
        if not gated:
            return None
        step = max(last_batch_cost, cost.min_iteration_time)
        return SwapGate.over(blocks, queue.tokens_left, step, cost.swap_time)

    return PlanInputs(
        walk.wanted,
        walk.upcoming,
        lambda: queue.new_jobs_in_top_levels(*top_levels),
        enst,
        lambda: queue.largest_enst_first(movable, on_device.keys() - batch_ids, enst),  # type: ignore[arg-type]
        last_batch_cost,
        swap_gate,
    )
