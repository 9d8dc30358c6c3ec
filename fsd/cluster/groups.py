"""One Ray placement group per replica: the replica's actor and its tp x pp workers
reserved together, on one node, before anything loads.

Why a group: without one, N replicas of tp x pp GPUs each would have their workers
placed one by one, so two replicas can each grab half the GPUs they need and both
wait forever (or a replica's TP ranks land on different nodes, far from NVLink). A
STRICT_PACK group is all or nothing on one node; a replica that cannot get its group
is refused with what it asked for and what the cluster has, not left pending.

Bundle 0 holds the replica's actor (its scheduler and block manager); bundles 1..W
hold its W = tp x pp engine workers, which the engine places there itself
(`worker_placement`), so a restarted replica lands in the same reserved slots.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from fsd.errors import ConfigError

log = logging.getLogger("fsd.cluster")
PLACE_TIMEOUT = 60.0  # seconds for a group's resources to come free in a busy cluster


@dataclass(frozen=True)
class ReplicaShape:
    """What one replica reserves: its actor's CPUs (and GPU when it computes itself)
    and, when tp x pp > 1, one bundle per engine worker."""

    world: int  # tp x pp
    on_gpu: bool
    cpus: float  # the replica actor's CPUs (its share of the cores on CPU)

    def bundles(self) -> list[dict[str, float]]:
        if self.world == 1:
            return [{"CPU": self.cpus, **({"GPU": 1.0} if self.on_gpu else {})}]
        # the actor only schedules; its workers compute
        worker = {"GPU": 1.0} if self.on_gpu else {"CPU": max(self.cpus / self.world, 0.01)}
        return [{"CPU": min(self.cpus, 1.0)}] + [dict(worker) for _ in range(self.world)]

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for bundle in self.bundles():
            for key, value in bundle.items():
                out[key] = out.get(key, 0.0) + value
        return out

    def actor_options(self) -> dict[str, float]:
        head = self.bundles()[0]
        return {"num_cpus": head["CPU"], "num_gpus": head.get("GPU", 0.0)}


def check_fits(shape: ReplicaShape, n: int, resources: dict[str, float]) -> None:
    """ConfigError when n replicas of `shape` cannot fit the cluster's total resources
    at all (asked before any group is made, so the error comes at once)."""
    for key, each in shape.totals().items():
        have = float(resources.get(key, 0.0))
        if each * n > have + 1e-9:
            per = f"tp x pp = {shape.world} " if shape.world > 1 else ""
            raise ConfigError(
                f"{n} replicas of {per}need {each * n:g} {key} in all ({each:g} each); "
                f"the Ray cluster has {have:g}: use fewer replicas"
                + (" or a smaller tp x pp" if shape.world > 1 else "")
            )


class ReplicaGroups:
    """The placement groups of N replicas, made and waited for at start, removed at
    close. A replica's group outlives its actor: a fresh copy reuses it."""

    def __init__(self, ray: Any, shape: ReplicaShape, n: int) -> None:
        from ray.util.placement_group import placement_group

        self.ray = ray
        self.shape = shape
        check_fits(shape, n, ray.cluster_resources())
        self.groups = [
            placement_group(shape.bundles(), strategy="STRICT_PACK", name=f"fsd-replica-{i}")
            for i in range(n)
        ]
        try:
            self._wait()
        except BaseException:
            self.close()
            raise

    def _wait(self) -> None:
        pending = {i: g.ready() for i, g in enumerate(self.groups)}
        start = time.monotonic()
        while pending:
            done, _ = self.ray.wait(list(pending.values()), num_returns=len(pending), timeout=5)
            pending = {i: ref for i, ref in pending.items() if ref not in done}
            waited = time.monotonic() - start
            if pending and waited >= PLACE_TIMEOUT:
                raise ConfigError(
                    f"replicas {sorted(pending)} could not be placed in {PLACE_TIMEOUT:g} s: "
                    f"each needs {self.shape.bundles()} on one node; the cluster has "
                    f"{self.ray.available_resources()} free"
                )
            if pending:
                log.info("waiting for the resources of %d replicas (%.0f s)", len(pending), waited)

    def options(self, index: int) -> dict[str, Any]:
        """Ray options placing replica `index`'s actor in bundle 0 of its group; the
        engine it starts sees the group (`worker_placement`)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            self.groups[index], placement_group_bundle_index=0,
            placement_group_capture_child_tasks=True,
        )  # fmt: skip
        return {**self.shape.actor_options(), "scheduling_strategy": strategy}

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for group in self.groups:
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                log.debug("a placement group was not removed", exc_info=True)
        self.groups = []
