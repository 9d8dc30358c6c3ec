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
from fsd.sched.gittins_queue import GittinsQueue
from fsd.sched.mlfq import MLFQQueue
from fsd.sched.queues import FCFSQueue, JobQueue, PriorityQueue, SRPTQueue
from fsd.sched.rules import (
    PolicyRules,
    quanta_for,
    rule_notes,
    rules_of,
    starve_limit_for,
    waiting_limit_for,
)

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
    """A queue policy: its class, and how a config builds it (default: the class
    called with the cost model, and its settings object if it declares one)."""

    queue: type[JobQueue]
    build: Build | None = None

    def make(self, name: str, config: SchedConfig, cost: CostModel) -> JobQueue:
        own = S.own_settings(config.policy_settings, name, S.settings_type(self.queue))
        if self.build is not None:
            return self.build(name, config, cost, own)
        return self.queue(cost) if own is None else self.queue(cost, own)  # type: ignore[call-arg]


def _mlfq(name: str, config: SchedConfig, cost: CostModel, _own: Any) -> JobQueue:
    rules = rules_for(config)
    queue = MLFQQueue(
        cost,
        quanta_for(config, cost),
        starve_limit_for(config, cost, rules),
        skip_join=name != "mlfq",
        promote_to=rules.starve_promote,
        charge_prefill=rules.charge_prefill,
        demote_rule=rules.demote_rule,
        waiting_limit=waiting_limit_for(config, cost, rules),
        preempt_threshold=rules.preempt_threshold,
    )
    queue.name = name
    return queue


def _gittins(name: str, config: SchedConfig, cost: CostModel, own: Any) -> JobQueue:
    return GittinsQueue(cost, quanta_for(config, cost), **dataclasses.asdict(own))


POLICY_TABLE: dict[str, Policy] = {
    "fcfs": Policy(FCFSQueue),
    "priority": Policy(PriorityQueue),
    "fsd": Policy(MLFQQueue, _mlfq),
    "sj-mlfq": Policy(MLFQQueue, _mlfq),
    "mlfq": Policy(MLFQQueue, _mlfq),
    "gittins": Policy(GittinsQueue, _gittins),
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
    return {name: S.settings_type(p.queue) for name, p in POLICY_TABLE.items()}


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


def rules_for(config: SchedConfig) -> PolicyRules:
    """The rules of `config`'s policy, with every setting the config gives applied."""
    return rules_of(config, resolve_policy(config.policy))


def policy_setting_notes() -> dict[str, str]:
    """Each SchedConfig setting's note for a command's help (every policy's own value
    of it), and the policies' own settings for `policy_settings`."""
    return {**rule_notes(), "policy_settings": f"({S.settings_help(settings_types())})"}


def make_queue(config: SchedConfig, cost: CostModel) -> JobQueue:
    name = resolve_policy(config.policy)
    return POLICY_TABLE[name].make(name, config, cost)


def make_scheduler(
    config: SchedConfig, cache: CacheConfig, blocks: BlockManager, cost: CostModel
) -> Scheduler:
    from fsd.sched.scheduler import Scheduler

    return Scheduler(config, cache, blocks, cost, make_queue, rules_for)
