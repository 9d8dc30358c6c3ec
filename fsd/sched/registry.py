"""Policy names -> queue classes: the one list of queue policies. `default` names the
policy fsd uses when none is given.

A new policy is its class (with its own `Settings`, if any: `fsd.sched.settings`)
and one line in `POLICY_TABLE`; the config, the command lines, retune and the
simulator read its name and settings from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsd.errors import ConfigError
from fsd.sched import settings as S
from fsd.sched.mlfq import MLFQQueue
from fsd.sched.queues import JobQueue
from fsd.sched.rules import FsdRules, MLFQRules, PaperRules, WalkRules, quanta_for
from fsd.sched.slo import default_slo
from fsd.sched.sorted_queues import FCFSQueue, PriorityQueue, SRPTQueue
from fsd.study.gittins_queue import GittinsQueue

if TYPE_CHECKING:
    from fsd.config import CacheConfig, SchedConfig
    from fsd.cost import CostModel
    from fsd.kv.block_manager import BlockManager
    from fsd.sched.scheduler import Scheduler

# the smallest worst-case regret on the validation set (bench/validation.py, worst_case)
DEFAULT_POLICY = "fsd"

# (policy name, config, cost, the policy's own settings) -> its queue
Build = Callable[[str, "SchedConfig", "CostModel", Any], JobQueue]


@dataclass(frozen=True)
class Policy:
    """A queue policy: its queue class, its own frozen settings class (None: it has
    none), and how a config builds its queue (default: the class called with the cost
    model, and its settings object if it declares one)."""

    queue: type[JobQueue]
    settings: type | None = None
    build: Build | None = None

    def make(self, name: str, config: SchedConfig, cost: CostModel) -> tuple[JobQueue, WalkRules]:
        """The policy's queue for `config`, and what the batch walk reads of its rules."""
        own = S.own_settings(config.policy_settings, name, self.settings)
        walk = own.walk() if hasattr(own, "walk") else WalkRules()
        if self.build is not None:
            return self.build(name, config, cost, own), walk
        return (self.queue(cost) if own is None else self.queue(cost, own)), walk  # type: ignore[call-arg]


def _mlfq(name: str, config: SchedConfig, cost: CostModel, rules: Any) -> JobQueue:
    queue = MLFQQueue(cost, quanta_for(config, cost), **rules.queue_args(default_slo(cost)))
    queue.name = name
    return queue


def _gittins(name: str, config: SchedConfig, cost: CostModel, own: Any) -> JobQueue:
    return GittinsQueue(cost, quanta_for(config, cost), **dataclasses.asdict(own))


POLICY_TABLE: dict[str, Policy] = {
    "fcfs": Policy(FCFSQueue),  # iteration-level FCFS, as vLLM: the baseline
    "priority": Policy(PriorityQueue),  # kept for study: the paper's first strawman
    "fsd": Policy(MLFQQueue, FsdRules, _mlfq),
    "sj-mlfq": Policy(MLFQQueue, PaperRules, _mlfq),  # the paper's section 4 as written
    "mlfq": Policy(MLFQQueue, MLFQRules, _mlfq),  # kept for study: a textbook baseline
    "gittins": Policy(GittinsQueue, GittinsQueue.Settings, _gittins),  # kept for study
    "srpt": Policy(SRPTQueue),  # the simulator's oracle: true output lengths
}
POLICIES = tuple(POLICY_TABLE)
SIMULATOR_ONLY = ("srpt",)


def resolve_policy(name: str) -> str:
    name = DEFAULT_POLICY if name == "default" else name
    if name not in POLICY_TABLE:
        raise ConfigError(f"unknown policy {name!r}; choose one of: default, {', '.join(POLICIES)}")
    return name


def engine_policy(name: str) -> str:
    """A policy the engine can run: any but the simulator's output-length oracle."""
    resolved = resolve_policy(name)
    if resolved in SIMULATOR_ONLY:
        raise ConfigError(f"policy {resolved!r} needs true output lengths; it runs in the simulator only")
    return resolved


def settings_types() -> dict[str, type | None]:
    """Each policy's settings class (None: it declares none)."""
    return {name: p.settings for name, p in POLICY_TABLE.items()}


def setting_names() -> tuple[str, ...]:
    """Every policy's settings, as `POLICY.FIELD`."""
    return tuple(S.declared(settings_types()))


def check_policies(sched: SchedConfig, cache: CacheConfig, *, engine: bool = True) -> None:
    """Both policy names and every policy setting, before anything is built: the
    one-line errors naming the valid choices (`engine`: the daemon's, which cannot run
    the simulator's oracle)."""
    from fsd.kv.registry import check_kv_policy

    (engine_policy if engine else resolve_policy)(sched.policy)
    S.check_values(sched.policy_settings, settings_types())
    check_kv_policy(cache.kv_policy)


def policy_setting_notes() -> dict[str, str]:
    """The note for `policy_settings` in a command's help: every policy's own settings."""
    return {"policy_settings": f"({S.settings_help(settings_types())})"}


def make_policy(config: SchedConfig, cost: CostModel) -> tuple[JobQueue, WalkRules]:
    """`config`'s policy: its queue, and what the batch walk reads of its rules."""
    name = resolve_policy(config.policy)
    return POLICY_TABLE[name].make(name, config, cost)


def make_queue(config: SchedConfig, cost: CostModel) -> JobQueue:
    return make_policy(config, cost)[0]


def make_scheduler(
    config: SchedConfig, cache: CacheConfig, blocks: BlockManager, cost: CostModel
) -> Scheduler:
    from fsd.sched.scheduler import Scheduler

    return Scheduler(config, cache, blocks, cost, make_policy)
