"""Which executor runs a config: in process, or on Ray actors.

A module of its own so that `executor` (the base class and the local executor) and
`ray_executor` (which builds on that base) do not import each other.
"""

from __future__ import annotations

from fsd.config import EngineConfig
from fsd.engine.executor import Executor, LocalExecutor


def make_executor(config: EngineConfig) -> Executor:
    """Local for tp = pp = 1; Ray actors otherwise (Ray is imported only then)."""
    par = config.parallel
    if par.tp * par.pp == 1 and par.ray_address is None:
        return LocalExecutor(config)
    from fsd.engine.ray_executor import RayExecutor

    return RayExecutor(config)
