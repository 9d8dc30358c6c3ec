"""Discrete-event simulator: the real scheduler and KV code, a cost model for time.

Exports load lazily, so `fsd.sim.cli` (imported by the `fsd` command line) stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "SimJob": "fsd.sim.job",
    "SimResult": "fsd.sim.engine",
    "SimulationError": "fsd.sim.engine",
    "Simulator": "fsd.sim.engine",
    "default_slo": "fsd.sim.engine",
    "simulate": "fsd.sim.engine",
    "RunSpec": "fsd.sim.runner",
    "run_many": "fsd.sim.runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fsd.sim' has no attribute {name!r}")
