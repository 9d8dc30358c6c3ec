"""Scheduling policies (pure Python, no torch): one interface, one class per policy."""

from fsd.sched.base import Scheduler, SchedulerOutput
from fsd.sched.registry import POLICIES, make_scheduler

__all__ = ["POLICIES", "Scheduler", "SchedulerOutput", "make_scheduler"]
