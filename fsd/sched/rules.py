"""The MLFQ family's rules: one frozen settings class per policy, each field a rule.

`sj-mlfq` is FastServe's section 4 as written (`PaperRules`); `fsd`, the default, is
the same queue with each of its departures from the paper a field of its own
(`FsdRules`), so any one can be switched off alone (`fsd.swap_gate=false`), as the
ablation in docs/scheduling.md does: there each rule's worth is measured. Plain
`mlfq` (every job enters Q1) is a textbook baseline kept for study.

Alphas are counts of the per-token SLO (fsd.sched.slo), so they follow the hardware.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsd.config_checks import check_types, choice, doc, int_range
from fsd.errors import ConfigError
from fsd.sched.mlfq import DEMOTE_RULES, PROMOTE_RULES, build_quanta

if TYPE_CHECKING:
    from fsd.config import SchedConfig
    from fsd.cost import CostModel

MAX_ALPHA_SLOS = 1e6  # a bound a retune cannot pass (an alpha of a million SLOs: never)
MAX_THRESHOLD = 256  # the most levels a queue has


@dataclass(frozen=True)
class WalkRules:
    """What the batch walk and the swap gate read of a policy (all off: the paper's walk)."""

    swap_gate: bool = False
    express: bool = False
    owner_leads: bool = False


def _alpha(name: str, value: float) -> None:
    if not 0 < value <= MAX_ALPHA_SLOS:
        raise ConfigError(f"{name} must be in (0, {MAX_ALPHA_SLOS:g}] SLOs, got {value}")


_HELP = {
    "alpha": "Starvation limit in SLOs: a started job waiting this long moves up.",
    "waiting_alpha": "Alpha of a job not yet started, in SLOs (0: alpha).",
    "promote": "Where a starved job goes: up1, top (Q1) or entry (its skip-join level).",
    "charge_prefill": "Charge a prefill as attained service.",
    "demote": "At a quantum's end: always demote, or gittins (keep the level while learned "
    "lengths say the job is closer to done than a fresh one).",
    "threshold": "Levels the last batch's jobs rank above their own.",
    "swap_gate": "Start work only while it fits the device; swap only when it pays.",
    "express": "With the swap gate: a short job ahead of every started one starts past the room.",
    "owner_leads": "With the swap gate: a short job of an owner with nothing started walks first.",
}


def _rule(name: str, default: Any) -> Any:
    return doc(default, _HELP[name])


@dataclass(frozen=True)
class MLFQRules:
    """Plain MLFQ's settings (kept for study): every job enters Q1, demotion one level
    at a time, every iteration charged."""

    alpha: float = _rule("alpha", 100.0)
    promote: str = _rule("promote", "up1")

    def __post_init__(self) -> None:
        check_types(self)
        _alpha("alpha", self.alpha)
        choice("promote", self.promote, PROMOTE_RULES)

    def walk(self) -> WalkRules:
        return WalkRules()

    def queue_args(self, slo: float) -> dict[str, Any]:
        """MLFQQueue's keywords for an SLO of `slo` seconds."""
        return {"starve_limit": self.alpha * slo, "skip_join": False, "promote_to": self.promote}


@dataclass(frozen=True)
class PaperRules:
    """The paper's skip-join MLFQ (`sj-mlfq`), section 4 as written: alpha = the SLO,
    starved jobs to Q1, every iteration charged, demotion at each quantum's end."""

    alpha: float = _rule("alpha", 1.0)
    waiting_alpha: float = _rule("waiting_alpha", 0.0)
    promote: str = _rule("promote", "top")
    charge_prefill: bool = _rule("charge_prefill", True)
    demote: str = _rule("demote", "always")
    threshold: int = _rule("threshold", 0)
    swap_gate: bool = _rule("swap_gate", False)
    express: bool = _rule("express", False)
    owner_leads: bool = _rule("owner_leads", False)

    def __post_init__(self) -> None:
        check_types(self)
        _alpha("alpha", self.alpha)
        if self.waiting_alpha:
            _alpha("waiting_alpha", self.waiting_alpha)
        choice("promote", self.promote, PROMOTE_RULES)
        choice("demote", self.demote, DEMOTE_RULES)
        int_range("threshold", self.threshold, 0, MAX_THRESHOLD, " levels")

    def walk(self) -> WalkRules:
        return WalkRules(self.swap_gate, self.express, self.owner_leads)

    def queue_args(self, slo: float) -> dict[str, Any]:
        """MLFQQueue's keywords for an SLO of `slo` seconds."""
        alpha = self.alpha * slo
        return {
            "starve_limit": alpha,
            "waiting_limit": self.waiting_alpha * slo if self.waiting_alpha else alpha,
            "promote_to": self.promote,
            "charge_prefill": self.charge_prefill,
            "demote_rule": self.demote,
            "preempt_threshold": self.threshold,
        }


@dataclass(frozen=True)
class FsdRules(PaperRules):
    """fsd's departures from the paper, each a rule that can be switched off alone
    (docs/scheduling.md, "The default's rules", measures each):

    - alpha = 100 SLOs, starved jobs one level up: the paper's Q1 at alpha = the SLO
      turns an overloaded MLFQ into round robin;
    - a job not yet started is promoted after 8 SLOs (its wait is all it has seen);
    - a prefill is not charged at the level skip-join chose by it;
    - at a quantum's end a job keeps its level while learned output lengths say it is
      closer to done than a fresh job (always demoting alike outputs is round robin);
    - the last batch's jobs rank 3 levels up: near-equal jobs stop taking turns
      through host memory;
    - the swap gate (fsd.kv.planner.SwapGate), with its express lane for short jobs
      and owners' leads (fsd.sched.batch).
    """

    alpha: float = _rule("alpha", 100.0)
    waiting_alpha: float = _rule("waiting_alpha", 8.0)
    promote: str = _rule("promote", "up1")
    charge_prefill: bool = _rule("charge_prefill", False)
    demote: str = _rule("demote", "gittins")
    threshold: int = _rule("threshold", 3)
    swap_gate: bool = _rule("swap_gate", True)
    express: bool = _rule("express", True)
    owner_leads: bool = _rule("owner_leads", True)


def quanta_for(config: SchedConfig, cost: CostModel) -> list[float]:
    """The per-level quanta: explicit, or q1 (default: a decode step) times the ratio."""
    if config.quanta is not None:
        return list(config.quanta)
    q1 = config.q1 if config.q1 is not None else cost.min_iteration_time
    return build_quanta(q1, config.quantum_ratio, config.num_levels)
