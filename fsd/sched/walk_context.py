"""What one iteration's batch walk reads (fsd.sched.batch): the scheduler's parts, given
to the walk, never the scheduler itself."""

from __future__ import annotations

from dataclasses import dataclass

from fsd.cost import CostModel
from fsd.kv.block_manager import BlockManager
from fsd.kv.policies import KVPolicy
from fsd.sched.eviction import Evictor
from fsd.sched.queues import JobQueue
from fsd.sched.rules import WalkRules
from fsd.sched.waiting import WaitingIndex


@dataclass(frozen=True)
class WalkContext:
    """What one iteration's walk reads: the scheduler's parts, never the scheduler."""

    queue: JobQueue
    blocks: BlockManager
    kv_policy: KVPolicy
    evictor: Evictor
    cost: CostModel
    rules: WalkRules
    max_batch_size: int
    max_batch_tokens: int
    prefill_budget: int  # prompt tokens one iteration may carry (0: whole prefills)
    admit_room: float  # blocks jobs without KV may still take
    waiting: WaitingIndex  # the live jobs' owners, the jobs without KV by size
