"""Joining or starting the Ray cluster that hosts fsd's workers.

Ray is imported only here and in the Ray executor, so a single-device engine never
pays for it. Usage statistics are off; actors get fsd's source directory on their
PYTHONPATH, so a checkout that is not installed (or installed in editable mode)
works the same in every worker process.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from fsd.errors import ConfigError

log = logging.getLogger("fsd.ray")


def fsd_source_root() -> str:
    """The directory that holds the `fsd` package (a checkout or site-packages)."""
    import fsd

    return str(Path(fsd.__file__).resolve().parent.parent)


def worker_env() -> dict[str, str]:
    """Environment for worker processes: fsd importable, no usage reporting."""
    root = fsd_source_root()
    path = os.environ.get("PYTHONPATH", "")
    parts = [root, *[p for p in path.split(os.pathsep) if p and p != root]]
    return {"PYTHONPATH": os.pathsep.join(parts), "RAY_USAGE_STATS_ENABLED": "0"}


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> tuple[Any, bool]:
    """(the ray module, whether this call started it): reuse, join `address`, or start.

    A process that already called ray.init (a test session, an application) keeps
    its cluster; `address` joins an existing one; otherwise a local one starts.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency
        raise ConfigError("tp/pp > 1 needs Ray: pip install 'ray>=2.9'") from None
    if ray.is_initialized():
        return ray, False
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "runtime_env": {"env_vars": worker_env()},
    }
    try:
        if address:
            log.info("joining the Ray cluster at %s", address)
            ray.init(address=address, **kwargs)
        else:
            log.info("starting a local Ray instance")
            ray.init(num_cpus=num_cpus, **kwargs)
    except ConnectionError as exc:
        raise ConfigError(f"cannot join the Ray cluster at {address!r}: {exc}") from None
    return ray, True
