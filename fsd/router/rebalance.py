"""The rebalancing rule the daemon (fsd.cluster.moves) and the simulator
(fsd.sim.replicas) share: which jobs move from a busy replica to an idle one.

An idle replica (no job) takes half the jobs beyond one of the busiest replica, the
ones that have not started first: they carry no KV, and they are the short jobs a
busy replica keeps waiting while another has nothing to do. Jobs already started come
after, in their order (the daemon moves one preempted to host memory with its KV; the
simulator moves only jobs that have not started).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

REBALANCE_EVERY = 0.25  # seconds between two looks of the rebalancer (daemon and simulator)


@dataclass(frozen=True)
class Rebalance:
    """Move up to `count` of `candidates` (in order) from `source` to `target`."""

    source: int
    target: int
    candidates: tuple[str, ...]
    count: int


def plan_rebalance(
    jobs: Mapping[int, Sequence[str]], started: Container[str], targets: Sequence[int]
) -> Rebalance | None:
    """The move to make now (module doc), or None. `jobs`: each replica's live jobs;
    `targets`: the replicas that take jobs (up, not draining)."""
    idle = [i for i in targets if not jobs.get(i)]
    if not idle or len(targets) < 2:
        return None
    busiest = max(targets, key=lambda i: len(jobs.get(i, ())))
    count = (len(jobs.get(busiest, ())) - 1) // 2
    if count <= 0:
        return None
    ordered = sorted(jobs[busiest], key=lambda j: j in started)  # not started first
    return Rebalance(busiest, idle[0], tuple(ordered), count)
