"""Run the twin forward: from a snapshot, under the current and the proposed settings.

Each seed draws one future (the live jobs' remaining lengths, the arrivals and their
lengths) and runs it twice, once per setting: common random numbers, so the
difference between the two sides is the settings', not the draws'. A run is the
simulator's event loop (fsd.sim.loop) started inside the running system
(`EventLoop.resume`): the restored scheduler holds the live jobs, copies in flight
are queued on their links, and the clock is this machine's (`Clock` over the
profile) up to the horizon. The proposal is applied with the scheduler's own
`retune`, the path a live retune takes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fsd.cost import CostModel
from fsd.engine.history import Clock
from fsd.protocol_preview import PreviewAssumptions, PreviewReply
from fsd.sched.retune import plain_value, plan_retune
from fsd.sched.scheduler import Scheduler
from fsd.sim.job import SimJob
from fsd.sim.loop import EventLoop
from fsd.twin.figures import JobTimes, side, window_figures
from fsd.twin.snapshot import TwinSnapshot, restore

MAX_CV = 20.0  # a fitted CV beyond this is a handful of bursts, not a process


class WallCost:
    """The event loop's clock on this machine: the profile's times through `Clock`."""

    def __init__(self, cost: CostModel, clock: Clock) -> None:
        self.cost, self.clock = cost, clock
        self.pipeline_stages = cost.pipeline_stages

    def iteration_time(self, prefills: Any, contexts: Any, cached: Any = ()) -> float:
        return self.clock(self.cost.iteration_time(prefills, contexts, cached))

    def swap_time(self, num_tokens: int) -> float:
        return self.cost.swap_time(num_tokens)


def _remaining(snap: TwinSnapshot, rng: np.random.Generator) -> dict[str, int]:
    """Each live job's total output: exact, or drawn from recent jobs that ran longer
    than it has (the tail it is in), capped at its limit; its limit when none did."""
    outputs = np.array([o for _, o, _ in snap.lengths], dtype=np.int64)
    totals = {}
    for lj in snap.live:
        if lj.exact:
            totals[lj.job_id] = lj.max_output
            continue
        longer = outputs[outputs > lj.generated]
        drawn = int(rng.choice(longer)) if longer.size else lj.max_output
        totals[lj.job_id] = max(lj.generated + 1, min(drawn, lj.max_output))
    return totals


def _arrivals(snap: TwinSnapshot, rng: np.random.Generator, horizon: float) -> list[SimJob]:
    fit, lengths = snap.arrivals, snap.lengths
    if fit.rate <= 0 or not lengths:
        return []
    # the fitted rate is itself uncertain: n arrivals of a renewal process with this CV
    # give it a relative error of about cv / sqrt(n); each future draws its own rate
    # (lognormal, mean-preserving), so the spread covers a rate the fit got wrong
    sigma = min(fit.cv, MAX_CV) / max(fit.seen, 1) ** 0.5
    rate = fit.rate * float(np.exp(rng.normal(0.0, sigma) - sigma * sigma / 2))
    mean = 1.0 / rate
    cv = min(max(fit.cv, 1e-3), MAX_CV)
    shape = 1.0 / (cv * cv)
    n = int(rate * horizon * 3) + 32
    times = snap.taken_at + np.cumsum(rng.gamma(shape, mean / shape, n))
    times = times[times <= snap.taken_at + horizon]
    picks = rng.integers(0, len(lengths), times.size)
    return [
        SimJob(f"twin-{k}", float(t), lengths[i][0], max(lengths[i][1], 1))
        for k, (t, i) in enumerate(zip(times, picks, strict=True))
    ]


def run_twin(
    snap: TwinSnapshot, changes: Mapping[str, Any] | None, horizon: float, seed: int
) -> tuple[list[SimJob], list[SimJob], EventLoop]:
    """One future, run to the horizon: the live jobs, the arrivals, and the loop (its
    counters). `changes` None: the current settings."""
    rng = np.random.default_rng(seed)
    totals = _remaining(snap, rng)  # drawn before the arrivals: equal on both sides
    arrivals = _arrivals(snap, rng, horizon)
    sched = restore(snap)
    t0 = snap.taken_at
    if changes:
        new_sched, new_cache = plan_retune(snap.sched, snap.cache, changes)
        sched.retune(t0, new_sched, new_cache)
    live = list(sched.jobs())
    for job in live:
        job.max_output = job.oracle_output_len = totals[job.job_id]
    clock = WallCost(sched.cost, snap.clock)
    loop = EventLoop(clock, sched, arrivals, clock.pipeline_stages, None, _stalled)  # type: ignore[arg-type]
    loop.resume(t0, list(sched.blocks.moving.values()))
    loop.run(start=t0, until=t0 + horizon)
    return live, arrivals, loop


def forward(
    snaps: TwinSnapshot | Sequence[TwinSnapshot],
    changes: Mapping[str, Any] | None,
    horizon: float,
    seed: int,
) -> dict[str, float]:
    """The figures of one run over the horizon (fsd.twin.figures, plus the counts). A
    daemon of several replicas gives one snapshot each: each runs forward on its own
    (with its own share of the arrivals), and the figures are the union's."""
    snaps = [snaps] if isinstance(snaps, TwinSnapshot) else list(snaps)
    jobs: list[SimJob] = []
    preemptions = swaps = peak = 0.0
    for snap in snaps:
        live, arrivals, loop = run_twin(snap, changes, horizon, seed)
        jobs += live + arrivals
        preemptions -= sum(lj.preemptions for lj in snap.live)
        swaps -= sum(lj.swaps for lj in snap.live)
        peak += loop.counters.peak_device_blocks
    t0 = snaps[0].taken_at
    figures = window_figures((_times(j) for j in jobs), t0, t0 + horizon, snaps[0].slo)
    figures["preemptions"] = preemptions + sum(j.preemptions for j in jobs)
    figures["swaps"] = swaps + sum(j.swaps_out + j.swaps_in for j in jobs)
    figures["peak_kv_blocks"] = peak
    return figures


def _times(job: SimJob) -> JobTimes:
    return JobTimes(job.arrival_time, job.first_token_time, job.finish_time, job.max_output)


def _stalled(sched: Scheduler, now: float) -> str:
    return f"the twin stalled at t={now:.3f}s with {len(sched)} jobs and nothing to run"


def preview(
    snaps: TwinSnapshot | Sequence[TwinSnapshot],
    changes: Mapping[str, Any],
    horizon: float,
    seeds: int,
) -> PreviewReply:
    """Current vs proposed over `horizon` seconds, `seeds` futures each (one snapshot,
    or one per replica: the change applies to every replica)."""
    t_wall = time.perf_counter()
    snaps = [snaps] if isinstance(snaps, TwinSnapshot) else list(snaps)
    for snap in snaps:  # refused here as retune would refuse it
        plan_retune(snap.sched, snap.cache, changes)
    seed_list = list(range(seeds))
    current = [forward(snaps, None, horizon, s) for s in seed_list]
    proposed = [forward(snaps, changes, horizon, s) for s in seed_list]
    notes = [f"{len(snaps)} replicas, each run forward on its own"] if len(snaps) > 1 else []
    assumed = assumptions(snaps[0], horizon, seed_list)
    assumed.live_jobs = sum(len(s.live) for s in snaps)
    assumed.sampled_remaining = sum(not lj.exact for s in snaps for lj in s.live)
    assumed.arrival_rate = sum(s.arrivals.rate for s in snaps)
    assumed.notes = [*notes, *assumed.notes]
    return PreviewReply(
        changes={k: plain_value(v) for k, v in changes.items()},
        current=side(current),
        proposed=side(proposed),
        assumptions=assumed,
        wall_s=time.perf_counter() - t_wall,
    )


def assumptions(snap: TwinSnapshot, horizon: float, seeds: list[int]) -> PreviewAssumptions:
    fit, clock = snap.arrivals, snap.clock
    notes = list(snap.notes)
    if fit.rate <= 0 or not snap.lengths:
        notes.append("no arrivals assumed: too few recent arrivals or finished jobs to fit")
    if clock.samples == 0:
        notes.append("clock: no iteration measured yet; the profile's times as they are")
    notes.append("arrivals reuse no cached prefix (their prompts are not known)")
    return PreviewAssumptions(
        taken_at=snap.taken_at,
        horizon=horizon,
        seeds=seeds,
        live_jobs=len(snap.live),
        sampled_remaining=sum(not lj.exact for lj in snap.live),
        arrival_rate=fit.rate,
        arrival_cv=fit.cv if math.isfinite(fit.cv) else 1.0,
        arrival_window=fit.window,
        arrivals_seen=fit.seen,
        lengths_from=len(snap.lengths),
        clock_scale=clock.scale,
        clock_overhead=clock.overhead,
        clock_samples=clock.samples,
        slo=snap.slo,
        notes=notes,
    )
