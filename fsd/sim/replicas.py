"""Replicas behind a router: N simulated engines, the daemon's routing code.

Each replica is an `EventLoop` with its own scheduler and block manager (the pools of
one replica: the profile's, as a lone simulator has), on the same cost model. At
each arrival every replica is advanced to the arrival's time (`EventLoop.run` with
`hold`: up to its next decision at or past it, nothing at that instant applied),
the router reads their states and picks one, and the job joins that replica's loop,
which takes it at its next decision exactly as a lone simulator would. With one
replica this is the lone simulator to the last bit (tests/sim/test_replicas.py).

Pushes: a replica pushes a `ReplicaState` after every iteration, or at most one per
`ClusterConfig.push_interval` seconds of its clock, built by the daemon's own
`StateBuilder`. The router only reads the latest, so a push is built when the router
next decides, if the replica has decided since: the state it would have had. What
the router routed to a replica since its last push is its optimistic guess.

Beside the usual row (fsd.sim.metrics.summarize over every job; its counters summed
over the replicas, peaks the largest replica's, `busy_frac` the replicas' mean) a run
reports: the spread of load (`busy_cv`, the coefficient of variation of the
replicas' busy time; `queue_max_mean`, the mean over arrivals of the longest
replica queue over the mean one), prefix hits by tier over all replicas,
`split_share` (of the requests whose leading prefix an earlier request had, those
whose longest such prefix had only gone to other replicas: Mooncake's first block is
everyone's, so the longest, not the first, says whether a conversation was split),
the router's time per decision, its resyncs, and `migrations`: the jobs the
daemon's rebalancer (fsd.router.rebalance) moved from the busiest replica to an idle
one, looked at on arrivals at most every REBALANCE_EVERY simulated seconds (only jobs that have not started
move here: no KV copy is modelled). KV samples (`kv_sample_s`) are
a lone simulator's: none are taken here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from fsd.config import ClusterConfig
from fsd.cost import CostModel
from fsd.kv.block_manager import BlockManager
from fsd.kv.prefix_events import chain_names
from fsd.protocol_telemetry import PrefixInfo
from fsd.router.rebalance import REBALANCE_EVERY, plan_rebalance
from fsd.router.registry import check_router, make_router
from fsd.router.request import RouteRequest
from fsd.router.router import Router
from fsd.router.state import StateBuilder
from fsd.sched.registry import make_scheduler
from fsd.sim.engine import SimResult, Simulator, check_done
from fsd.sim.job import SimJob
from fsd.sim.loop import EventLoop
from fsd.sim.metrics import Counters, prefix_metrics, summarize
from fsd.workload.mooncake import MOONCAKE_BLOCK_TOKENS
from fsd.workload.spec import Workload

PROGRESS_EVERY = 1024  # arrivals between two progress reports


class _NotWaiting:
    """Started, as the rebalancing rule reads it: any job not among the movable ones."""

    def __init__(self, movable: dict[int, set[str]]) -> None:
        self.movable = set().union(*movable.values())

    def __contains__(self, job_id: object) -> bool:
        return job_id not in self.movable


@dataclass
class _Replica:
    """One replica's loop, its state builder, its clock and what it was sent."""

    loop: EventLoop
    builder: StateBuilder
    now: float | None = None  # its next decision (None: no job yet)
    pushes: int = 0
    pushed: float | None = None  # `now` at its last push
    pushed_at: float = -float("inf")  # the router's clock at that push
    seen: set[int] = field(default_factory=set)  # prefix hashes routed here


@dataclass
class _Spread:
    """What the run measures across replicas while it routes (module doc)."""

    ratios: list[float] = field(default_factory=list)  # longest / mean queue per arrival
    seen: set[int] = field(default_factory=set)  # prefix hashes routed anywhere
    same: int = 0  # requests whose leading prefix an earlier request had
    split: int = 0  # of them, those whose longest such prefix went elsewhere only

    def sample(self, reps: list[_Replica]) -> None:
        queues = [r.loop.live + r.loop.n - r.loop.i for r in reps]
        mean = sum(queues) / len(queues)
        if mean > 0:
            self.ratios.append(max(queues) / mean)

    def routed(self, rep: _Replica, hashes: tuple[int, ...]) -> None:
        anywhere = _leading(hashes, self.seen)
        if anywhere:
            self.same += 1
            self.split += _leading(hashes, rep.seen) < anywhere
        self.seen.update(hashes)
        rep.seen.update(hashes)


def _leading(hashes: tuple[int, ...], seen: set[int]) -> int:
    n = 0
    for h in hashes:
        if h not in seen:
            break
        n += 1
    return n


def request_of(job: SimJob, block_size: int) -> RouteRequest:
    """What the router reads of a simulated job: its prompt blocks' content names."""
    n = job.prompt_len // block_size
    names = chain_names(job.block_content(i, block_size) for i in range(n))
    return RouteRequest(job.job_id, job.prompt_len, tuple(names))


class ReplicaSimulator(Simulator):
    """`ClusterConfig.replicas` simulators behind one router (module doc)."""

    def __init__(
        self, cost: CostModel, *args: Any, cluster: ClusterConfig | None = None, **options: Any
    ) -> None:
        """`args` and `options`: the Simulator's (sched, cache, num_gpu_blocks, ...)."""
        super().__init__(cost, *args, **options)
        self.cluster = cluster or ClusterConfig()
        check_router(self.cluster.router)

    def run(
        self, workload: Workload, on_progress: Callable[[int, int], None] | None = None
    ) -> SimResult:
        """Route and simulate every request; the metric row has the module doc's extras."""
        self.check(workload)
        t_wall = time.perf_counter()
        bs = self.cache_config.block_size
        router = make_router(self.cluster, self.cost, bs)
        reps = [self._replica(i) for i in range(self.cluster.replicas)]
        hb = int(workload.params.get("hash_block", MOONCAKE_BLOCK_TOKENS))  # type: ignore[call-overload]
        jobs = [
            SimJob(f"r{i}", r.arrival, r.prompt_len, r.output_len, workload.prefix_of(i), hb)
            for i, r in enumerate(workload)
        ]
        spread = _Spread()
        self.migrations, next_look = 0, -float("inf")
        for k, job in enumerate(jobs):
            t = job.arrival_time
            for rep in reps:
                if rep.now is not None:
                    rep.now = rep.loop.run(start=rep.now, until=t, hold=True)
                self._push(rep, router, t)
            if t >= next_look:  # the daemon's rebalancer, on the replicas' clock
                self._rebalance(reps, t)
                next_look = t + REBALANCE_EVERY
            spread.sample(reps)
            rep = reps[router.choose(request_of(job, bs)).replica]
            rep.loop.add(job)
            rep.now = t if rep.now is None else rep.now
            spread.routed(rep, job.prefix_hashes)
            if on_progress is not None and k % PROGRESS_EVERY == 0:
                on_progress(sum(r.loop.i - r.loop.live for r in reps), len(jobs))
        for rep in reps:
            if rep.now is not None:
                rep.loop.run(start=rep.now)
            check_done(rep.loop.sched)
        if on_progress is not None:
            on_progress(len(jobs), len(jobs))
        metrics = self._metrics(jobs, reps, router, spread)
        metrics["sim_wall_s"] = time.perf_counter() - t_wall
        name = reps[0].loop.sched.queue.name
        return SimResult(name, metrics, jobs, self.pools, [], metrics["sim_wall_s"], None)

    def _replica(self, i: int) -> _Replica:
        blocks = BlockManager(self.pools.device, self.cache_config.block_size, self.pools.host)
        sched = make_scheduler(self.sched_config, self.cache_config, blocks, self.cost)
        builder = StateBuilder(i, blocks)
        loop = EventLoop(self.cost, sched, [], self.pipeline_stages, None, self._stalled)
        return _Replica(loop, builder)

    def _rebalance(self, reps: list[_Replica], t: float) -> None:
        """Waiting jobs of the busiest replica to an idle one (fsd.router.rebalance, the
        daemon's rule); only jobs that have not started move here (they carry no KV)."""
        jobs = {i: [j.job_id for j in r.loop.sched.jobs()] for i, r in enumerate(reps)}
        movable = {i: set(r.loop.waiting()) for i, r in enumerate(reps)}
        plan = plan_rebalance(jobs, _NotWaiting(movable), list(range(len(reps))))
        if plan is None:
            return
        src, dst = reps[plan.source], reps[plan.target]
        for job_id in [j for j in plan.candidates if j in movable[plan.source]][: plan.count]:
            dst.loop.give(src.loop.take(job_id), t)
            self.migrations += 1
        dst.now = t if dst.now is None else min(dst.now, t)

    def _push(self, rep: _Replica, router: Router, t: float) -> None:
        """The replica's state to the router, if it decided since its last push (and
        the push interval has passed)."""
        if rep.pushes and rep.now == rep.pushed:
            return
        if t - rep.pushed_at < self.cluster.push_interval:
            return
        state = rep.builder.build(rep.loop.sched, t, rep.loop.i)
        if router.update(state):
            rep.builder.resync()
        rep.pushes += 1
        rep.pushed, rep.pushed_at = rep.now, t

    def _metrics(
        self, jobs: list[SimJob], reps: list[_Replica], router: Router, spread: _Spread
    ) -> dict[str, float | int]:
        metrics = summarize(jobs, combined(r.loop.counters for r in reps), self.slo)
        stats = [r.loop.blocks.prefix.stats() for r in reps]
        summed = {k: sum(getattr(s, k) for s in stats) for k in PrefixInfo.__struct_fields__}
        summed["enabled"] = stats[0].enabled
        metrics.update(prefix_metrics(PrefixInfo(**summed), jobs))
        busy = np.array([r.loop.counters.busy_s for r in reps])
        timing = router.timing()
        metrics.update(
            replicas=len(reps),
            router=router.name,  # type: ignore[dict-item]
            busy_cv=float(busy.std() / busy.mean()) if busy.mean() > 0 else 0.0,
            queue_max_mean=float(np.mean(spread.ratios)) if spread.ratios else 1.0,
            same_prefix_requests=spread.same,
            split_share=spread.split / spread.same if spread.same else 0.0,
            migrations=self.migrations,
            resyncs=router.resyncs,
            router_decision_us=timing["mean_s"] * 1e6,
            router_decision_p99_us=timing["p99_s"] * 1e6,
        )
        return metrics


def combined(counters: object) -> Counters:
    """The replicas' counters as one: totals summed, peaks the largest, busy time the
    mean (so `busy_frac` is the replicas' mean utilisation)."""
    out, n = Counters(), 0
    for c in counters:  # type: ignore[attr-defined]
        n += 1
        for f in fields(Counters):
            a, b = getattr(out, f.name), getattr(c, f.name)
            setattr(out, f.name, max(a, b) if f.name.startswith("peak") else a + b)
    out.busy_s /= max(n, 1)
    return out
