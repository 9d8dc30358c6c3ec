"""Scheduling (pure Python, no torch): queue policies, batch formation, ENST, live retune.

Owns: which jobs run each iteration. The queue policies, one class per policy behind
`JobQueue` (`queues`), named in `registry`; each policy's own settings declared on its
class (`settings`), the level-queue family's rules each policy sets (`rules`): the
level-queue family on `levels` (levels, FIFO inside, entry level, ENST in `enst`) with
the paper's MLFQ (`mlfq`) and the Gittins-ranked queue (`gittins_queue`, ranking by
`ranks` of the output `lengths` learned) as siblings. The batch walk (`batch`), eviction
for room (`eviction`), the scheduler that ties them to a KV policy (`scheduler`), what
it decides and shows (`decision`: a leaf the engine and telemetry read), and the rules the engine, the simulator and the scenario injector share: admission
(`admission`), retune validation (`retune`), the default SLO (`slo`), the
micro-batches in flight of a pipeline (`pipeline`). Iteration time is fsd.cost's.

May import: fsd.kv, fsd.cost, fsd.jobs, fsd.config, fsd.config_checks, fsd.errors, numpy. Never torch,
nor fsd.engine, fsd.server, fsd.sim or the console: the same code runs in the engine
and in the simulator, and is unit-tested in milliseconds.
"""

from __future__ import annotations

from fsd.lazy import lazy_exports

# Exports load lazily: the command line and fsd.config read only the policy names.
_EXPORTS = {
    "CostModel": "fsd.cost",
    "DEFAULT_POLICY": "fsd.sched.registry",
    "POLICIES": "fsd.sched.registry",
    "make_scheduler": "fsd.sched.registry",
    "resolve_policy": "fsd.sched.registry",
    "Scheduler": "fsd.sched.scheduler",
    "SchedulerOutput": "fsd.sched.decision",
}
__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
