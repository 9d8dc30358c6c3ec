"""Policy names → queue classes, and each policy's own rules. `default` names the policy
fsd uses when none is given."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsd.errors import ConfigError
from fsd.sched.slo import default_slo

if TYPE_CHECKING:  # the policies load on first use: `fsd --help` needs only the names
    from fsd.config import CacheConfig, SchedConfig
    from fsd.cost import CostModel
    from fsd.kv.block_manager import BlockManager
    from fsd.sched.mlfq import MLFQQueue
    from fsd.sched.queues import JobQueue
    from fsd.sched.scheduler import Scheduler

# the smallest worst-case regret on the validation set (bench/validation.py, worst_case)
DEFAULT_POLICY = "fsd"
STARVE_LIMIT_SLOS = 100  # fsd's starvation limit alpha, in SLOs
WAITING_LIMIT_SLOS = 8  # fsd's alpha for a job that has not started, in SLOs


@dataclass(frozen=True)
class PolicyRules:
    """A policy's own value of each SchedConfig setting left at None (alphas in SLOs;
    waiting_slos None: the same alpha as a started job's)."""

    starve_slos: float
    waiting_slos: float | None
    starve_promote: str
    charge_prefill: bool
    demote_rule: str
    preempt_threshold: int
    swap_gate: bool


# fsd's departures from the paper, each measured on the tuning workloads (README,
# "Scheduling"): alpha = the SLO with promotion to Q1 turns an overloaded MLFQ into
# round robin (11.5 swaps per request and 13.9 s between tokens at P99 on the
# conversation trace x0.5, against 2.8 and 0.2 s); a prefill is not charged at the
# level skip-join chose by it; alike outputs keep their level (gittins); near-equal
# jobs stop taking turns through host memory (threshold 3); and the swap gate
# (fsd.kv.planner.SwapGate) keeps the reserve by admission instead of by swaps.
FSD_RULES = PolicyRules(STARVE_LIMIT_SLOS, WAITING_LIMIT_SLOS, "up1", False, "gittins", 3, True)
# FastServe section 4 as written: alpha tuned to the SLO, starved jobs to Q1, attained
# service counts every iteration, demotion at each quantum's end, ENST swaps.
PAPER_RULES = PolicyRules(1, None, "top", True, "always", 0, False)
# naive MLFQ keeps the rules it was measured with (skip-join-only ones do not apply)
_MLFQ_RULES = PolicyRules(STARVE_LIMIT_SLOS, None, "up1", True, "always", 0, False)


# each policy's own values of the settings (the rest keep _MLFQ_RULES)
OWN_RULES = {"fsd": FSD_RULES, "sj-mlfq": PAPER_RULES}
# the SchedConfig setting each rule is the policy's value of, where the names differ
# (alphas: seconds in the config, SLOs in the rules)
SETTING_OF = {"starve_slos": "starve_limit", "waiting_slos": "starve_limit_waiting"}


def rules_for(config: SchedConfig) -> PolicyRules:
    """The rules of `config`'s policy, with every setting the config gives applied."""
    base = OWN_RULES.get(resolve_policy(config.policy), _MLFQ_RULES)
    given = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(PolicyRules)
        if f.name not in SETTING_OF and getattr(config, f.name) is not None
    }
    return PolicyRules(**{**base.__dict__, **given})


def policy_setting_notes() -> dict[str, str]:
    """Each setting's note for a command's help: every policy's own value of it."""

    def shown(rule: str, value: object) -> str:
        if rule in SETTING_OF:
            return "alpha" if value is None else f"{value:g} x the SLO"
        if isinstance(value, bool):
            return "on" if value else "off"
        return str(value)

    notes = {}
    for f in dataclasses.fields(PolicyRules):
        own = [f"{name} {shown(f.name, getattr(rules, f.name))}" for name, rules in OWN_RULES.items()]
        rest = shown(f.name, getattr(_MLFQ_RULES, f.name))
        notes[SETTING_OF.get(f.name, f.name)] = f"(unset: the policy's; {', '.join(own)}; others {rest})"
    return notes


def resolve_policy(name: str) -> str:
    name = DEFAULT_POLICY if name == "default" else name
    if name not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; choose one of: default, {', '.join(POLICIES)}")
    return name


def engine_policy(name: str) -> str:
    """A policy the engine can run: any but the simulator's output-length oracle."""
    resolved = resolve_policy(name)
    if resolved == "srpt":
        raise ConfigError("policy 'srpt' needs true output lengths; it runs in the simulator only")
    return resolved


def check_policies(sched: SchedConfig, cache: CacheConfig, *, engine: bool = True) -> None:
    """Both policy names, before anything is built: the one-line errors naming the valid
    choices (`engine`: the daemon's, which cannot run the simulator's oracle)."""
    from fsd.kv.registry import check_kv_policy

    (engine_policy if engine else resolve_policy)(sched.policy)
    check_kv_policy(cache.kv_policy)


def quanta_for(config: SchedConfig, cost: CostModel) -> list[float]:
    from fsd.sched.mlfq import build_quanta

    if config.quanta is not None:
        return list(config.quanta)
    q1 = config.q1 if config.q1 is not None else cost.min_iteration_time
    return build_quanta(q1, config.quantum_ratio, config.num_levels)


def starve_limit_for(config: SchedConfig, cost: CostModel) -> float:
    """Alpha in seconds: the configured one, or the policy's in SLOs of the profile."""
    if config.starve_limit is not None:
        return config.starve_limit
    return rules_for(config).starve_slos * default_slo(cost)


def waiting_limit_for(config: SchedConfig, cost: CostModel) -> float:
    """Alpha of a job that has not started: configured, the policy's, or alpha itself."""
    if config.starve_limit_waiting is not None:
        return config.starve_limit_waiting
    slos = rules_for(config).waiting_slos
    return starve_limit_for(config, cost) if slos is None else slos * default_slo(cost)


def _mlfq(config: SchedConfig, cost: CostModel, skip_join: bool) -> MLFQQueue:
    from fsd.sched.mlfq import MLFQQueue

    rules = rules_for(config)
    queue = MLFQQueue(
        cost,
        quanta_for(config, cost),
        starve_limit_for(config, cost),
        skip_join=skip_join,
        promote_to=rules.starve_promote,
        charge_prefill=rules.charge_prefill,
        demote_rule=rules.demote_rule,
        waiting_limit=waiting_limit_for(config, cost),
        preempt_threshold=rules.preempt_threshold,
    )
    queue.name = resolve_policy(config.policy) if skip_join else "mlfq"
    return queue


def _gittins(config: SchedConfig, cost: CostModel) -> JobQueue:
    from fsd.sched.gittins_queue import GittinsQueue

    return GittinsQueue(cost, quanta_for(config, cost))


# The one list of queue policies: a new policy is its class plus one line here.
def _simple(name: str) -> Callable[[SchedConfig, CostModel], JobQueue]:
    def make(config: SchedConfig, cost: CostModel) -> JobQueue:
        from fsd.sched import queues

        return getattr(queues, name)(cost)

    return make


QUEUES: dict[str, Callable[[SchedConfig, CostModel], JobQueue]] = {
    "fcfs": _simple("FCFSQueue"),
    "priority": _simple("PriorityQueue"),
    "fsd": lambda config, cost: _mlfq(config, cost, skip_join=True),
    "sj-mlfq": lambda config, cost: _mlfq(config, cost, skip_join=True),
    "mlfq": lambda config, cost: _mlfq(config, cost, skip_join=False),
    "gittins": _gittins,
    "srpt": _simple("SRPTQueue"),
}
POLICIES = tuple(QUEUES)


def make_queue(config: SchedConfig, cost: CostModel) -> JobQueue:
    return QUEUES[resolve_policy(config.policy)](config, cost)


def make_scheduler(
    config: SchedConfig, cache: CacheConfig, blocks: BlockManager, cost: CostModel
) -> Scheduler:
    from fsd.sched.scheduler import Scheduler

    return Scheduler(config, cache, blocks, cost, make_queue, rules_for)
