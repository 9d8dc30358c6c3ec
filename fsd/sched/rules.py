"""The level-queue family's rules: each policy's own value of the SchedConfig settings
left at None (fsd's departures from the paper, each with its reason), and the quanta
and starvation limits a config and a cost model give."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsd.sched.mlfq import build_quanta
from fsd.sched.slo import default_slo

if TYPE_CHECKING:
    from fsd.config import SchedConfig
    from fsd.cost import CostModel

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
MLFQ_RULES = PolicyRules(STARVE_LIMIT_SLOS, None, "up1", True, "always", 0, False)


# each policy's own values of the settings (the rest keep MLFQ_RULES)
OWN_RULES = {"fsd": FSD_RULES, "sj-mlfq": PAPER_RULES}
# the SchedConfig setting each rule is the policy's value of, where the names differ
# (alphas: seconds in the config, SLOs in the rules)
SETTING_OF = {"starve_slos": "starve_limit", "waiting_slos": "starve_limit_waiting"}


def rules_of(config: SchedConfig, policy: str) -> PolicyRules:
    """The rules of `policy` (a resolved name), with every setting `config` gives applied."""
    base = OWN_RULES.get(policy, MLFQ_RULES)
    given = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(PolicyRules)
        if f.name not in SETTING_OF and getattr(config, f.name) is not None
    }
    return PolicyRules(**{**base.__dict__, **given})


def rule_notes() -> dict[str, str]:
    """Each setting's note for a command's help: every policy's own value of it."""

    def shown(rule: str, value: object) -> str:
        if rule in SETTING_OF:
            return "alpha" if value is None else f"{value:g} x the SLO"
        if isinstance(value, bool):
            return "on" if value else "off"
        return str(value)

    notes = {}
    for f in dataclasses.fields(PolicyRules):
        own = [
            f"{name} {shown(f.name, getattr(rules, f.name))}" for name, rules in OWN_RULES.items()
        ]
        rest = shown(f.name, getattr(MLFQ_RULES, f.name))
        notes[SETTING_OF.get(f.name, f.name)] = (
            f"(unset: the policy's; {', '.join(own)}; others {rest})"
        )
    return notes


def quanta_for(config: SchedConfig, cost: CostModel) -> list[float]:
    """The per-level quanta: explicit, or q1 (default: a decode step) times the ratio."""
    if config.quanta is not None:
        return list(config.quanta)
    q1 = config.q1 if config.q1 is not None else cost.min_iteration_time
    return build_quanta(q1, config.quantum_ratio, config.num_levels)


def starve_limit_for(config: SchedConfig, cost: CostModel, rules: PolicyRules) -> float:
    """Alpha in seconds: the configured one, or the policy's in SLOs of the profile."""
    if config.starve_limit is not None:
        return config.starve_limit
    return rules.starve_slos * default_slo(cost)


def waiting_limit_for(config: SchedConfig, cost: CostModel, rules: PolicyRules) -> float:
    """Alpha of a job that has not started: configured, the policy's, or alpha itself."""
    if config.starve_limit_waiting is not None:
        return config.starve_limit_waiting
    slos = rules.waiting_slos
    return starve_limit_for(config, cost, rules) if slos is None else slos * default_slo(cost)
