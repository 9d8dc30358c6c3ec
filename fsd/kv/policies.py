"""KV policies: what happens to KV when device blocks run short (paper §4.2).

  defer      new jobs wait for free blocks (MLFQ degrades to FCFS under pressure);
             a device-resident job that must grow drops a lower job's KV
  recompute  drop lower-priority jobs' KV; they re-prefill later
  reactive   swap lower-priority jobs out, and chosen host jobs in, on the critical path
  proactive  keep a reserve free; swap out the largest ENST, swap in the smallest,
             asynchronously beside the model step; forced (synchronous) eviction only
             when the reserve did not suffice

The scheduler asks a policy three questions while it forms a batch (may this job
evict others, may it drop their KV, does a host job come in now or later) and lets it
plan copies once the batch is formed. A new policy is one class here plus its line
in `fsd.kv.registry`.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from fsd.jobs import Job, KVLocation
from fsd.kv.block_manager import BlockManager
from fsd.kv.planner import ArrivalEstimate, SwapGate, SwapPlanner
from fsd.kv.swap import SwapOp

if TYPE_CHECKING:
    from fsd.config import CacheConfig
    from fsd.cost import CostModel


@dataclass(frozen=True)
class PlanInputs:
    """What the scheduler knows after forming a batch, for a policy's async copies."""

    wanted: list[Job]  # host jobs the batch would have taken now
    upcoming: list[Job]  # host jobs next in line after a full batch
    new_top_jobs: Callable[[], int]  # jobs without KV in the top K' levels
    enst: Callable[[Job], float]
    by_enst: Callable[[], Iterator[tuple[float, Job]]]  # movable jobs, largest ENST first
    iteration_time: float  # the previous batch's profiled time (copies beside one step)
    gate: Callable[[], SwapGate | None] = lambda: None  # whether a swap-out pays (built lazily)


class KVPolicy(ABC):
    """How KV makes room: evict (drop or swap) lower jobs; bring host jobs back."""

    name: ClassVar[str]
    swaps: ClassVar[bool] = False  # evicted KV goes to the host when it fits there
    defers_host_jobs: ClassVar[bool] = False  # host jobs come in asynchronously, later

    def __init__(
        self, blocks: BlockManager, cache: CacheConfig, cost: CostModel, arrivals: ArrivalEstimate
    ) -> None:
        self.blocks = blocks
        self.cache = cache
        self.cost = cost
        self.arrivals = arrivals

    @property
    def reserve(self) -> int:
        """Device blocks the policy keeps free for arrivals (0: none)."""
        return 0

    def may_evict_for(self, job: Job) -> bool:
        """Whether lower jobs' KV may make room for `job`."""
        return True

    def may_drop_for(self, job: Job) -> bool:
        """Whether a lower job's KV may be dropped (recomputed later) for `job`.

        Dropping a started job's KV to admit a job that has none loops under load (the
        dropped job is promoted later and drops another), so swapping policies let a
        new job displace only KV that can move to the host.
        """
        return not self.swaps or job.kv is KVLocation.DEVICE

    def plan(self, inputs: PlanInputs) -> Sequence[SwapOp]:
        """Asynchronous copies to start beside the step (none by default)."""
        return ()


class DeferPolicy(KVPolicy):
    """New jobs wait for free blocks; only device-resident jobs may grow by dropping."""

    name = "defer"

    def may_evict_for(self, job: Job) -> bool:
        return job.kv is KVLocation.DEVICE


class RecomputePolicy(KVPolicy):
    """Drop lower-priority jobs' KV; they re-prefill when they run again."""

    name = "recompute"


class ReactivePolicy(KVPolicy):
    """Swap lower jobs out, and host jobs in, synchronously on the critical path."""

    name = "reactive"
    swaps = True


class ProactivePolicy(ReactivePolicy):
    """Keep a reserve free; move KV by ENST asynchronously beside the step."""

    name = "proactive"
    defers_host_jobs = True

    def __init__(
        self, blocks: BlockManager, cache: CacheConfig, cost: CostModel, arrivals: ArrivalEstimate
    ) -> None:
        super().__init__(blocks, cache, cost, arrivals)
        self.planner = SwapPlanner(blocks, cache, arrivals)
        self._reserve = 0

    @property
    def reserve(self) -> int:
        return self._reserve

    def plan(self, inputs: PlanInputs) -> Sequence[SwapOp]:
        reserve = self._reserve = self.planner.reserve_blocks(inputs.new_top_jobs())
        moving = self.blocks.moving
        if not self.planner.has_work(inputs.wanted, inputs.upcoming, moving, reserve):
            return ()
        return self.planner.plan(
            inputs.wanted,
            inputs.upcoming,
            inputs.enst,
            reserve,
            moving,
            self.planner.block_budget(self.cost, inputs.iteration_time),
            inputs.by_enst,
            inputs.gate(),
        )
