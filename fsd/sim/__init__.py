"""Discrete-event simulator: the real scheduler and KV code, a cost model for time.

Owns: simulated time. Jobs (`job`), the event loop (`engine`), the metrics of a run
(`metrics`), pool sizing (`capacity`), batches of runs and sweeps (`runner`,
`sweep`), replicas behind a router (`replicas`) and `fsd simulate` (`cli`). It differs from the engine only in where time
comes from: admission, token append and stop, the SLO and the pipeline's in-flight
jobs are the shared rules of fsd.admission, fsd.sched and fsd.jobs.

May import: fsd.admission, fsd.sched, fsd.kv, fsd.router, fsd.cost, fsd.jobs,
fsd.workload, fsd.metrics, fsd.config, fsd.errors. Never torch, fsd.engine, fsd.server or the console.
Exports load lazily, so `fsd.sim.cli` (imported by the `fsd` command line) stays cheap.
"""

from __future__ import annotations

from fsd.lazy import lazy_exports

_EXPORTS = {
    "SimJob": "fsd.sim.job",
    "SimResult": "fsd.sim.engine",
    "SimulationError": "fsd.sim.engine",
    "Simulator": "fsd.sim.engine",
    "default_slo": "fsd.sched.slo",
    "simulate": "fsd.sim.engine",
    "ReplicaSimulator": "fsd.sim.replicas",
    "RunSpec": "fsd.sim.runner",
    "run_many": "fsd.sim.runner",
}
__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
