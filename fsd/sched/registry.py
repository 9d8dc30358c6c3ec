"""Policy names → queue classes. `default` names the policy fsd uses when none is given."""

from __future__ import annotations

from fsd.config import CacheConfig, SchedConfig
from fsd.errors import ConfigError
from fsd.kv.block_manager import BlockManager
from fsd.sched.mlfq import MLFQQueue, build_quanta
from fsd.sched.profile import CostModel
from fsd.sched.queues import FCFSQueue, JobQueue, PriorityQueue, SRPTQueue
from fsd.sched.scheduler import Scheduler

POLICIES = ("fcfs", "priority", "mlfq", "sj-mlfq", "srpt")
DEFAULT_POLICY = "sj-mlfq"
SLO_DECODE_STEPS = 10  # the per-token latency SLO: 10 decode steps
STARVE_LIMIT_SLOS = 100  # the default starvation limit alpha, in SLOs
WAITING_LIMIT_SLOS = 8  # the default alpha for a job that has not started, in SLOs


def resolve_policy(name: str) -> str:
    name = DEFAULT_POLICY if name == "default" else name
    if name not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; choose one of: default, {', '.join(POLICIES)}")
    return name


def quanta_for(config: SchedConfig, cost: CostModel) -> list[float]:
    if config.quanta is not None:
        return list(config.quanta)
    q1 = config.q1 if config.q1 is not None else cost.min_iteration_time
    return build_quanta(q1, config.quantum_ratio, config.num_levels)


def _alpha(value: float | None, slos: int, cost: CostModel) -> float:
    """A configured alpha, or `slos` SLOs of the profile's decode step."""
    return value if value is not None else slos * SLO_DECODE_STEPS * cost.min_iteration_time


def starve_limit_for(config: SchedConfig, cost: CostModel) -> float:
    return _alpha(config.starve_limit, STARVE_LIMIT_SLOS, cost)


def waiting_limit_for(config: SchedConfig, cost: CostModel) -> float:
    return _alpha(config.starve_limit_waiting, WAITING_LIMIT_SLOS, cost)


def make_queue(config: SchedConfig, cost: CostModel) -> JobQueue:
    name = resolve_policy(config.policy)
    if name in ("mlfq", "sj-mlfq"):
        return MLFQQueue(
            cost,
            quanta_for(config, cost),
            starve_limit_for(config, cost),
            skip_join=name == "sj-mlfq",
            promote_to=config.starve_promote,
            charge_prefill=config.charge_prefill,
            demote_rule=config.demote_rule,
            waiting_limit=waiting_limit_for(config, cost),
            preempt_threshold=config.preempt_threshold,
        )
    return {"fcfs": FCFSQueue, "priority": PriorityQueue, "srpt": SRPTQueue}[name](cost)


def make_scheduler(
    config: SchedConfig, cache: CacheConfig, blocks: BlockManager, cost: CostModel
) -> Scheduler:
    return Scheduler(config, cache, blocks, cost, make_queue)
