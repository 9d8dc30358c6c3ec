"""Workloads: arrival processes, length models, trace readers, and the request list they make."""

from fsd.workload.arrivals import ArrivalProcess, gamma, make_arrivals, poisson
from fsd.workload.lengths import PRESETS, LengthModel, Lognormal, Zipf, length_model
from fsd.workload.spec import Request, Workload, synthetic
from fsd.workload.trace import read_trace

__all__ = [
    "PRESETS",
    "ArrivalProcess",
    "LengthModel",
    "Lognormal",
    "Request",
    "Workload",
    "Zipf",
    "gamma",
    "length_model",
    "make_arrivals",
    "poisson",
    "read_trace",
    "synthetic",
]
