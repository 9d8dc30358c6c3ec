"""Policy names → queue classes. `default` names the policy fsd uses when none is given."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fsd.errors import ConfigError

if TYPE_CHECKING:  # the policies load on first use: `fsd --help` needs only the names
    from fsd.config import CacheConfig, SchedConfig
    from fsd.cost import CostModel
    from fsd.kv.block_manager import BlockManager
    from fsd.sched.mlfq import MLFQQueue
    from fsd.sched.queues import JobQueue
    from fsd.sched.scheduler import Scheduler

# the smallest worst-case regret on the validation set (bench/validation.py, worst_case)
DEFAULT_POLICY = "sj-mlfq"
SLO_DECODE_STEPS = 10  # the per-token latency SLO: 10 decode steps
STARVE_LIMIT_SLOS = 100  # the default starvation limit alpha, in SLOs
WAITING_LIMIT_SLOS = 8  # the default alpha for a job that has not started, in SLOs


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


def default_slo(cost: CostModel) -> float:
    """The paper's per-token latency SLO: 10 decode steps (the profile's minimum iteration)."""
    return SLO_DECODE_STEPS * cost.min_iteration_time


def quanta_for(config: SchedConfig, cost: CostModel) -> list[float]:
    from fsd.sched.mlfq import build_quanta

    if config.quanta is not None:
        return list(config.quanta)
    q1 = config.q1 if config.q1 is not None else cost.min_iteration_time
    return build_quanta(q1, config.quantum_ratio, config.num_levels)


def _alpha(value: float | None, slos: int, cost: CostModel) -> float:
    """A configured alpha, or `slos` SLOs of the profile's decode step."""
    return value if value is not None else slos * default_slo(cost)


def starve_limit_for(config: SchedConfig, cost: CostModel) -> float:
    return _alpha(config.starve_limit, STARVE_LIMIT_SLOS, cost)


def waiting_limit_for(config: SchedConfig, cost: CostModel) -> float:
    return _alpha(config.starve_limit_waiting, WAITING_LIMIT_SLOS, cost)


def _mlfq(config: SchedConfig, cost: CostModel, skip_join: bool) -> MLFQQueue:
    from fsd.sched.mlfq import MLFQQueue

    return MLFQQueue(
        cost,
        quanta_for(config, cost),
        starve_limit_for(config, cost),
        skip_join=skip_join,
        promote_to=config.starve_promote,
        charge_prefill=config.charge_prefill,
        demote_rule=config.demote_rule,
        waiting_limit=waiting_limit_for(config, cost),
        preempt_threshold=config.preempt_threshold,
    )


def _gittins(config: SchedConfig, cost: CostModel) -> JobQueue:
    from fsd.sched.soap import GittinsQueue

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
    "mlfq": lambda config, cost: _mlfq(config, cost, skip_join=False),
    "sj-mlfq": lambda config, cost: _mlfq(config, cost, skip_join=True),
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

    return Scheduler(config, cache, blocks, cost, make_queue)
