"""Latency and SLO statistics of one simulated run (the paper's §6.1 metrics).

Per-token latency of a job = its end-to-end latency (arrival to last token) divided
by its output tokens; `avg` is the mean over jobs, `p50/p95/p99` its percentiles
(numpy's linear interpolation). A job meets the SLO when its per-token latency is at
most `slo` seconds; goodput is those jobs per second of makespan (first arrival to
last finish). TTFT = first token time - arrival; TPOT = (finish - first token) /
(output tokens - 1) over jobs with more than one output token.

TBT (time between tokens): every gap between two consecutive output tokens of a job,
all jobs' gaps pooled (`tbt_mean` weighs each token alike, where `tpot` weighs each
job). Its tail is what a running job sees when others' prefills or preemptions stall
it: `tbt_p99`.

Sustainable (`sustainable`, `throughput_ratio`): a finite run past capacity still ends,
and its averages can look fine (the backlog drains after the last arrival), so a
load counts as served only if the run kept up with it: over the second half of the
arrivals, W = [t_mid, t_last] (t_mid halfway between the first and the last
arrival), completed throughput >= SUSTAINED_FRACTION x offered throughput, where

  offered rate   = work falling due in W / |W|
  completed rate = offered rate - the backlog's growth rate over W
  backlog(t)     = work due by t - work completed by t; its growth rate is the
                   least-squares slope of BACKLOG_SAMPLES samples evenly over W

in two units of work: output tokens (`token_ratio`; completed when emitted) and
requests (`request_ratio`; completed when finished). Work falls due at the earliest
time any server could do it: a request arriving at a with n output tokens has its
k-th token (k = 0..n-1) due at a + k x g and itself at a + (n-1) x g, g the shortest
gap between two tokens in the run (a decode step at its fastest). Why not at the
arrival: a long job then counts as n tokens of backlog for its whole (unavoidable)
service time, and one such job in flight near t_last reads as falling behind when
W is not many latencies long (a few hundred ShareGPT requests at a high rate).

`throughput_ratio` is the smaller ratio; sustainable when it is >= 0.97. Nothing after
the last arrival counts, so a drain cannot rescue an overload; weighing by tokens
stops SRPT passing by finishing the many short jobs while the long ones pile up;
counting requests stops a policy passing by starving a few short ones. A burst still
undrained at the last arrival reads as falling behind (at that point, it is).

Joint attainment (`joint_attainment`): the fraction of jobs whose TTFT and TPOT are
both within bounds (a one-token job has no TPOT: TTFT alone), the P95 goodput's test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fsd.metrics import percentile
from fsd.protocol_telemetry import PrefixInfo
from fsd.sim.job import SimJob

# Completed / offered work over the second half of arrivals that counts as keeping up.
SUSTAINED_FRACTION = 0.97
BACKLOG_SAMPLES = 512  # times in the second half at which the backlog is measured

# The keys every result carries, in the order tables show them.
HEADLINE = (
    "avg",
    "p50",
    "p95",
    "p99",
    "ttft",
    "tpot",
    "tbt_mean",
    "tbt_p99",
    "goodput",
    "preemptions",
    "swaps",
    "peak_kv_blocks",
)


@dataclass
class Counters:
    """Totals the simulator keeps while it runs."""

    iterations: int = 0
    busy_s: float = 0.0  # time the model was stepping (sync swaps included)
    sync_swap_s: float = 0.0  # swap time on the critical path (reactive / forced)
    async_swap_s: float = 0.0  # link time of copies overlapped with steps
    batched_jobs: int = 0  # sum of batch sizes (mean batch = / iterations)
    prefill_tokens: int = 0
    peak_device_blocks: int = 0
    peak_host_blocks: int = 0
    peak_jobs: int = 0  # most unfinished jobs in the system at once


def summarize(jobs: Sequence[SimJob], counters: Counters, slo: float) -> dict[str, float | int]:
    """The result row of one run: latency statistics, SLO goodput, swap and KV counters."""
    done = [j for j in jobs if j.finish_time is not None]
    refused = sum(j.refused for j in jobs)  # turned away on arrival: never finish
    if lost := len(jobs) - len(done) - refused:
        raise AssertionError(f"{lost} jobs did not finish")
    ptl = np.array([j.per_token_latency for j in done])
    e2e = np.array([j.latency for j in done])
    ttft = np.array([j.ttft for j in done])
    gaps = token_gaps(done)
    tpot = np.array([t for t in map(job_tpot, done) if t is not None])
    start = min((j.arrival_time for j in done), default=0.0)
    end = max((j.finish_time for j in done), default=0.0)  # type: ignore[type-var]
    makespan = max(end - start, 1e-12)
    met = int((ptl <= slo).sum()) if ptl.size else 0
    tokens, n = sum(j.max_output for j in done), len(done)
    kept = throughput(done)
    preempted = sum(j.preemptions for j in done)
    swaps_out, swaps_in = sum(j.swaps_out for j in done), sum(j.swaps_in for j in done)
    return {
        "requests": n,
        "avg": float(ptl.mean()) if n else float("nan"),
        "p50": percentile(ptl, 50),
        "p95": percentile(ptl, 95),
        "p99": percentile(ptl, 99),
        "ttft": float(ttft.mean()) if n else float("nan"),
        "ttft_p95": percentile(ttft, 95),
        "ttft_p99": percentile(ttft, 99),
        "tpot": float(tpot.mean()) if tpot.size else float("nan"),
        "tbt_mean": float(gaps.mean()) if gaps.size else float("nan"),
        "tbt_p50": percentile(gaps, 50),
        "tbt_p99": percentile(gaps, 99),
        "tbt_max": float(gaps.max()) if gaps.size else float("nan"),
        "latency_avg": float(e2e.mean()) if n else float("nan"),
        "slo": slo,
        "slo_attainment": met / len(jobs) if jobs else float("nan"),  # the refused missed
        "refused": refused,
        "refused_frac": refused / len(jobs) if jobs else 0.0,
        "goodput": met / makespan,
        "throughput_rps": n / makespan,
        "throughput_tps": tokens / makespan,
        "makespan_s": makespan,
        "throughput_ratio": kept.ratio,
        "token_ratio": kept.token_ratio,
        "request_ratio": kept.request_ratio,
        "sustainable": kept.sustainable,
        "preemptions": preempted,
        "swaps": swaps_out + swaps_in,
        # per finished request: thrashing shows here whatever the run's length
        "preemptions_per_request": preempted / max(n, 1),
        "swaps_per_request": (swaps_out + swaps_in) / max(n, 1),
        "swaps_out": swaps_out,
        "swaps_in": swaps_in,
        "recomputes": sum(j.recomputes for j in done),
        "promotions": sum(j.promotions for j in done),
        **_loop_figures(counters, makespan),
    }


def _loop_figures(counters: Counters, makespan: float) -> dict[str, float | int]:
    """The event loop's own counters: KV peaks, iterations, batch, swap seconds."""
    return {
        "peak_kv_blocks": counters.peak_device_blocks,
        "peak_host_blocks": counters.peak_host_blocks,
        "peak_jobs": counters.peak_jobs,
        "iterations": counters.iterations,
        "mean_batch": counters.batched_jobs / counters.iterations if counters.iterations else 0.0,
        "busy_frac": counters.busy_s / makespan,
        "sync_swap_s": counters.sync_swap_s,
        "async_swap_s": counters.async_swap_s,
    }


def token_gaps(jobs: Sequence[SimJob]) -> np.ndarray:
    """Every gap between consecutive output tokens of `jobs`, in one array (seconds)."""
    parts = [np.frombuffer(j.gaps) for j in jobs if j.gaps]
    return np.concatenate(parts) if parts else np.zeros(0)


def job_tpot(job: SimJob) -> float | None:
    """Time per output token after the first: (finish - first token) / (outputs - 1)."""
    if job.max_output <= 1:
        return None
    return (job.finish_time - job.first_token_time) / (job.max_output - 1)  # type: ignore[operator]


def joint_attainment(jobs: Sequence[SimJob], ttft_slo: float, tpot_slo: float) -> float:
    """Fraction of `jobs` with TTFT <= ttft_slo and TPOT <= tpot_slo (NaN for no jobs)."""
    if not jobs:
        return float("nan")
    met = 0
    for j in jobs:
        tpot = job_tpot(j)
        met += j.ttft <= ttft_slo and (tpot is None or tpot <= tpot_slo)
    return met / len(jobs)


@dataclass(frozen=True)
class Throughput:
    """Completed against offered work over the second half of a run's arrivals."""

    token_ratio: float
    request_ratio: float

    @property
    def ratio(self) -> float:
        return min(self.token_ratio, self.request_ratio)

    @property
    def sustainable(self) -> bool:
        return self.ratio >= SUSTAINED_FRACTION


def throughput(jobs: Sequence[SimJob]) -> Throughput:
    """Both ratios of the module docstring's sustainability test over finished `jobs`.

    With all arrivals at one instant there is no rate to keep up with: both are 1.
    """
    arrival = np.array([j.arrival_time for j in jobs], dtype=float)
    if not len(jobs) or arrival.max() <= arrival.min():
        return Throughput(1.0, 1.0)
    grid = np.linspace((arrival.min() + arrival.max()) / 2, arrival.max(), BACKLOG_SAMPLES)
    n = np.array([j.max_output for j in jobs])
    gaps = token_gaps(jobs)
    step = float(gaps.min()) if gaps.size else 0.0  # no job emits two tokens closer
    finish = np.array([j.finish_time for j in jobs], dtype=float)
    due = np.repeat(arrival, n) + step * (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
    return Throughput(
        _kept(grid, due, _token_times(jobs)),
        _kept(grid, arrival + step * (n - 1), finish),
    )


def _kept(grid: np.ndarray, due: np.ndarray, done: np.ndarray) -> float:
    """Completed / offered rate over `grid`: 1 - the backlog's slope / the offered rate.

    One unit of work falls due at each time of `due` and completes at each of `done`.
    """
    offered = np.searchsorted(np.sort(due), grid, side="right")
    completed = np.searchsorted(np.sort(done), grid, side="right")
    rate = (offered[-1] - offered[0]) / (grid[-1] - grid[0])
    if rate <= 0:
        return 1.0
    # a least-squares slope, not the end points: one long job in flight at either end
    # would move a few-hundred-request run's end-point ratio by percents
    slope = np.polyfit(grid, offered - completed, 1)[0]
    return float(1.0 - slope / rate)


def _token_times(jobs: Sequence[SimJob]) -> np.ndarray:
    """When every output token of `jobs` was emitted: first tokens, then the gaps summed on."""
    first = np.array([j.first_token_time for j in jobs], dtype=float)
    parts = [np.frombuffer(j.gaps) if j.gaps else np.zeros(0) for j in jobs]
    counts = np.array([len(p) for p in parts])
    if not counts.sum():
        return first
    # one cumsum over all gaps, less each job's running total at its start
    cs = np.cumsum(np.concatenate(parts))
    before = np.concatenate(([0.0], cs))[np.cumsum(counts) - counts]
    return np.concatenate((first, cs - np.repeat(before, counts) + np.repeat(first, counts)))


def prefix_metrics(stats: PrefixInfo, jobs: Sequence[SimJob]) -> dict[str, float | int]:
    """The prefix cache's part of a result row: the share of prompt tokens each job's
    first prefill found cached (and by tier, over every lookup, recomputes included),
    prefill tokens saved, and evictions."""
    prompt = sum(j.prompt_len for j in jobs)
    cached = sum(j.num_cached_tokens for j in jobs)
    q = max(stats.queries, 1)
    return {
        "prefix_cache": int(stats.enabled),
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
        "prefix_hit_rate_device": (stats.hits - stats.host_hits) / q,
        "prefix_hit_rate_host": stats.host_hits / q,
        "prefill_tokens_saved": stats.hits,
        "prefix_evictions": stats.device_evictions,
        "prefix_host_evictions": stats.host_evictions,
    }
