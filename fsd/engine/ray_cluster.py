"""Joining or starting the Ray cluster that hosts fsd's workers.

Ray is imported only here and in the Ray executor, so a single-device engine never
pays for it. Usage statistics are off; actors get fsd's source directory on their
PYTHONPATH, so a checkout that is not installed (or installed in editable mode)
works the same in every worker process.

A local cluster listens on 127.0.0.1 only. Ray's processes (GCS, raylet and its
object manager, the agents, every worker and the driver) bind all interfaces unless
the node's IP is the loopback address, and `ray.init` turns a loopback
`_node_ip_address` into the host's public IP; the one switch that keeps it is Ray's
single-machine mode (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, the default on macOS
and Windows), set while the local cluster starts, and while this process joins a
cluster by a loopback address (one that another fsd started here). Joining a remote
cluster keeps Ray's defaults: Ray's ports are then open to its network.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fsd.errors import ConfigError

log = logging.getLogger("fsd.ray")


def fsd_source_root() -> str:
    """The directory that holds the `fsd` package (a checkout or site-packages)."""
    return str(Path(__file__).resolve().parents[2])  # ROOT/fsd/engine/ray_cluster.py


def worker_env() -> dict[str, str]:
    """Environment for worker processes: fsd importable, no usage reporting."""
    root = fsd_source_root()
    path = os.environ.get("PYTHONPATH", "")
    parts = [root, *[p for p in path.split(os.pathsep) if p and p != root]]
    return {"PYTHONPATH": os.pathsep.join(parts), "RAY_USAGE_STATS_ENABLED": "0"}


_SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": the node IP is 127.0.0.1


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """While a local Ray starts: its node IP is 127.0.0.1, so every process binds there.

    Ray reads the switch from the environment once, at import, so the imported
    constant is set too; both are restored after (a later `ray.init(address=...)`
    in this process must advertise a reachable IP). Started processes inherit the
    environment, and the workers the raylet starts later inherit the raylet's.
    """
    from ray._private import ray_constants

    saved_env = os.environ.get(_SINGLE_MACHINE)
    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[_SINGLE_MACHINE] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop(_SINGLE_MACHINE, None)
        else:
            os.environ[_SINGLE_MACHINE] = saved_env
        if saved is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved


def _is_loopback(address: str) -> bool:
    """127.0.0.1:6379, localhost:6379, [::1]:6379, ray://127.0.0.1:10001 ..."""
    host = urlsplit(address if "://" in address else f"//{address}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "auto", a host name or an interface


def node_ip(ray: Any) -> str | None:
    """The IP address this process's Ray node advertises (and listens on), if known."""
    try:
        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - informative only
        return None


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
            # a cluster on this machine's loopback (one fsd started): the driver, which
            # Ray would otherwise give the host's IP, must be reachable there too
            joining = loopback_node() if _is_loopback(address) else contextlib.nullcontext()
            with joining:
                ray.init(address=address, **kwargs)
        else:
            log.info("starting a local Ray instance (listening on 127.0.0.1 only)")
            with loopback_node():
                ray.init(num_cpus=num_cpus, **kwargs)
            ip = node_ip(ray)
            if ip is not None and ip != "127.0.0.1":  # a Ray release that ignores the switch
                log.warning("the local Ray instance listens on %s, not only on loopback", ip)
    except ConnectionError as exc:
        raise ConfigError(f"cannot join the Ray cluster at {address!r}: {exc}") from None
    return ray, True


def worker_placement(world: int) -> list[dict[str, Any]] | None:
    """Each of `world` engine workers' Ray options when this process is a replica
    placed in a group of 1 + world bundles (fsd.cluster.groups): worker k takes
    bundle k + 1 with that bundle's resources. None outside such a group."""
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = get_current_placement_group()
    if group is None or len(group.bundle_specs) != world + 1:
        return None
    return [
        {
            "num_cpus": spec.get("CPU", 0.0),
            "num_gpus": spec.get("GPU", 0.0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=k + 1
            ),
        }
        for k, spec in enumerate(group.bundle_specs[1:])
    ]
