"""Policy names → classes. `default` names the policy fsd uses when none is given."""

from __future__ import annotations

from fsd.config import SchedConfig
from fsd.errors import ConfigError
from fsd.kv.block_manager import BlockManager
from fsd.sched.base import Scheduler
from fsd.sched.fcfs import FCFSScheduler

POLICIES: dict[str, type[Scheduler]] = {cls.name: cls for cls in (FCFSScheduler,)}
DEFAULT_POLICY = "fcfs"


def resolve_policy(name: str) -> str:
    name = DEFAULT_POLICY if name == "default" else name
    if name not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; choose one of: default, {', '.join(POLICIES)}")
    return name


def make_scheduler(config: SchedConfig, blocks: BlockManager) -> Scheduler:
    return POLICIES[resolve_policy(config.policy)](config, blocks)
