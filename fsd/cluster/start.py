"""Starting N replicas of one engine config: where each runs and with what share."""

from __future__ import annotations

import logging
from typing import Any

from fsd.cluster.chooser import RouterChooser
from fsd.cluster.face import Chooser, LeastLive, ReplicaSetFace
from fsd.cluster.groups import ReplicaShape
from fsd.cluster.handles import LocalReplicas, RayReplicas, Replicas, replica_configs
from fsd.config import ClusterConfig, EngineConfig
from fsd.config_checks import MAX_REPLICAS
from fsd.errors import ConfigError
from fsd.router.registry import check_router, make_router

log = logging.getLogger("fsd.cluster")


def cpu_share(usable: int, replicas: int) -> int:
    """CPU cores (and torch threads) per CPU replica: the usable cores less one for
    the daemon's loop, split evenly, at least one each."""
    return max(1, (usable - 1) // replicas)


def start_replicas(
    config: EngineConfig,
    n: int,
    *,
    cluster: ClusterConfig | None = None,
    chooser: Chooser | None = None,
    in_process: bool = False,
) -> ReplicaSetFace:
    """N replicas of `config` behind one face: Ray actors (on the cluster at
    `config.parallel.ray_address`, or a local one), or threads of this process. The
    router is `cluster`'s (fsd.router, priced with the first replica's cost model);
    without one, `chooser` (default: the least live jobs)."""
    from fsd.engine.threads import usable_cpus
    from fsd.models.loader import describe_model, resolve_device

    if not 1 <= n <= MAX_REPLICAS:
        raise ConfigError(f"replicas must be in [1, {MAX_REPLICAS}], got {n}")
    if cluster is not None:
        check_router(cluster.router)  # before any replica loads its model
    model = describe_model(config.model)  # the tokenizer, without weights
    if config.parallel.tp * config.parallel.pp > 1:  # refused here, not in N actors
        from fsd.engine.ray_executor import validate_parallel

        validate_parallel(model.arch, config.parallel.tp, config.parallel.pp)
    on_gpu = resolve_device(config.model.device).type == "cuda"
    share = None if on_gpu else cpu_share(usable_cpus(), n)
    configs = replica_configs(config, n, share)
    log.info(
        "starting %d replicas of %s (%s)", n, config.model.model,
        "one GPU each" if on_gpu else f"{share} CPU threads each",
    )  # fmt: skip
    routed = None if cluster is None else cluster.push_interval  # seconds between pushes
    replicas: Replicas
    if in_process:
        replicas = LocalReplicas(configs, routed)
    else:
        world = config.parallel.tp * config.parallel.pp
        shape = ReplicaShape(world, on_gpu, float(share or 1))
        replicas = RayReplicas(configs, routed, config.parallel.ray_address, shape)
    try:
        if cluster is not None:
            fixed = replicas.call(0, "fixed")
            router = make_router(cluster, fixed.cost, config.cache.block_size)
            chooser = RouterChooser(router, lambda i: replicas.call(i, "resync"))
        return ReplicaSetFace(replicas, chooser or LeastLive(n), model.tokenizer)
    except BaseException:
        replicas.close()
        raise


def describe(face: Any) -> str:
    """One line for the log: the replicas and their pools."""
    n = len(face.replicas)
    return f"{n} replicas of {face.info.source}, {face.info.kv_tokens} KV tokens each"
