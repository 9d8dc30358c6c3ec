"""Workloads: arrival processes, length models, trace readers (Azure CSV, Mooncake
JSONL), scenarios, and the request lists they make.

Owns: what requests arrive when (never how they are served). Used by the
simulator, the scenario injector, `fsctl play` and the benches.

May import: fsd.errors, fsd.metrics, numpy. Never torch, fsd.sched, fsd.kv,
fsd.engine, fsd.server or the console.
"""

from fsd.workload.arrivals import ArrivalProcess, gamma, make_arrivals, poisson
from fsd.workload.length_models import (
    PRESETS,
    LengthModel,
    Lognormal,
    Mixture,
    Uniform,
    Zipf,
    length_model,
    mixture,
)
from fsd.workload.mooncake import read_mooncake
from fsd.workload.scenario import Scenario, load_scenario
from fsd.workload.spec import Request, Workload, synthetic
from fsd.workload.timeline import Timeline, expand
from fsd.workload.trace import read_trace

__all__ = [
    "PRESETS",
    "ArrivalProcess",
    "LengthModel",
    "Lognormal",
    "Mixture",
    "Request",
    "Scenario",
    "Timeline",
    "Uniform",
    "Workload",
    "Zipf",
    "expand",
    "gamma",
    "length_model",
    "load_scenario",
    "make_arrivals",
    "mixture",
    "poisson",
    "read_mooncake",
    "read_trace",
    "synthetic",
]
