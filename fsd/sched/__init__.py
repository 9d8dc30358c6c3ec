"""Scheduling (pure Python, no torch): queue policies, the scheduler, the cost model."""

from fsd.sched.profile import CostModel
from fsd.sched.registry import DEFAULT_POLICY, POLICIES, make_scheduler, resolve_policy
from fsd.sched.scheduler import Scheduler, SchedulerOutput

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CostModel",
    "Scheduler",
    "SchedulerOutput",
    "make_scheduler",
    "resolve_policy",
]
