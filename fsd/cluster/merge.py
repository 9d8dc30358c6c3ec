"""Many replicas' snapshots as one: what telemetry, `fsd status` and the console show
for the whole daemon (the sums of the pools and counters, the levels side by side)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence, Set

from fsd.engine.face import RECENT_ITERATIONS
from fsd.engine.views import EngineSnapshot, SwapBytes, kv_info
from fsd.kv.block_manager import KVStats
from fsd.protocol_telemetry import PrefixInfo, ReplicaInfo
from fsd.sched.decision import SchedulerStats
from fsd.sched.queues import LevelView


def merge_snapshots(snaps: Sequence[EngineSnapshot]) -> EngineSnapshot:
    """One snapshot of N: pools, counters and jobs summed; each level holds every
    replica's jobs of that level; the policy, quanta and config are the first's (a
    retune applies to all)."""
    first = snaps[0]
    iterations = sorted((it for s in snaps for it in s.iterations), key=lambda it: it.start)
    jobs = None if first.jobs is None else [j for s in snaps for j in (s.jobs or [])]
    degraded = [f"replica {i}: {s.degraded}" for i, s in enumerate(snaps) if s.degraded]
    return EngineSnapshot(
        time=max(s.time for s in snaps),
        config=first.config,
        sched=_merge_sched([s.sched for s in snaps]),
        kv=_sum(KVStats, [s.kv for s in snaps], keep=("block_size",)),
        swap=_sum(SwapBytes, [s.swap for s in snaps]),
        prefix=_sum_prefix([s.prefix for s in snaps]),
        iterations=iterations[-RECENT_ITERATIONS:],
        iteration_count=sum(s.iteration_count for s in snaps),
        live=sum(s.live for s in snaps),
        running=sum(s.running for s in snaps),
        degraded="; ".join(degraded) or None,
        jobs=jobs,
    )


def _merge_sched(stats: Sequence[SchedulerStats]) -> SchedulerStats:
    by_index: dict[int, LevelView] = {}
    for s in stats:
        for lv in s.levels:
            seen = by_index.get(lv.index)
            ids = lv.job_ids if seen is None else seen.job_ids + lv.job_ids
            by_index[lv.index] = LevelView(lv.index, lv.quantum, ids)
    return dataclasses.replace(
        stats[0],
        levels=[by_index[i] for i in sorted(by_index)],
        reserve=sum(s.reserve for s in stats),
    )


def _sum(cls: type, items: Sequence[object], keep: tuple[str, ...] = ()) -> object:
    """A dataclass of `cls` whose every field is the items' sum (`keep`: the first's)."""
    values = {
        f.name: getattr(items[0], f.name) if f.name in keep else sum(getattr(i, f.name) for i in items)
        for f in dataclasses.fields(cls)
    }
    return cls(**values)


def _sum_prefix(items: Sequence[PrefixInfo]) -> PrefixInfo:
    counts = {
        name: sum(getattr(p, name) for p in items)
        for name in PrefixInfo.__struct_fields__
        if name != "enabled"
    }
    return PrefixInfo(enabled=items[0].enabled, **counts)


def replica_infos(
    parts: Mapping[int, EngineSnapshot], down: Mapping[int, str], draining: Set[int]
) -> list[ReplicaInfo]:
    """Each replica's line: its load, pools, prefix cache and health (one that is down
    says only why; one being drained says "draining")."""
    infos = [ReplicaInfo(index=i, health=f"down: {why}") for i, why in down.items()]
    for i, s in parts.items():
        infos.append(
            ReplicaInfo(
                index=i,
                health=s.degraded or ("draining" if i in draining else "ok"),
                live=s.live,
                running=s.running,
                iterations=s.iteration_count,
                levels=[len(lv.job_ids) for lv in s.sched.levels],
                kv=kv_info(s),
                prefix=s.prefix,
            )
        )
    return sorted(infos, key=lambda r: r.index)
