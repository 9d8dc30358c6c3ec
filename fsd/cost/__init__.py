"""Cost models (pure Python, no torch): how long an iteration takes on a GPU.

Owns: predicted iteration time. `model.CostModel` (re-exported here: `from fsd.cost
import CostModel`) is the prediction from a batch's shape; `profiles` holds the shipped
profiles (JSON) and their loader; `analytic` derives a profile from first principles
over `hardware`'s data-sheet numbers (model shapes, GPUs); `stages` is how layers split
into pipeline stages; `fit` fits a profile to the profiler's timed iterations;
`calibration` (live cost) rescales predictions online to measured time.

May import: fsd.errors, numpy. Never torch, nor anything else of fsd: the scheduler,
the KV planner, the engine, the simulator and the twin all read it, so it sits below
them all. Its own modules import each other by module (`fsd.cost.model`), never
through this `__init__`.
"""

from __future__ import annotations

from fsd.cost.model import CostModel

__all__ = ["CostModel"]
