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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fsd.metrics import percentile
from fsd.sim.job import SimJob

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
    if len(done) != len(jobs):
        raise AssertionError(f"{len(jobs) - len(done)} jobs did not finish")
    ptl = np.array([j.per_token_latency for j in done])
    e2e = np.array([j.latency for j in done])
    ttft = np.array([j.ttft for j in done])
    gaps = token_gaps(done)
    tpot = np.array(
        [
            (j.finish_time - j.first_token_time) / (j.max_output - 1)
            for j in done
            if j.max_output > 1
        ]  # type: ignore[operator]
    )
    start = min((j.arrival_time for j in done), default=0.0)
    end = max((j.finish_time for j in done), default=0.0)  # type: ignore[type-var]
    makespan = max(end - start, 1e-12)
    met = int((ptl <= slo).sum()) if ptl.size else 0
    tokens = sum(j.max_output for j in done)
    n = len(done)
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
        "slo_attainment": met / n if n else float("nan"),
        "goodput": met / makespan,
        "throughput_rps": n / makespan,
        "throughput_tps": tokens / makespan,
        "makespan_s": makespan,
        "preemptions": sum(j.preemptions for j in done),
        "swaps": sum(j.swaps_out + j.swaps_in for j in done),
        "swaps_out": sum(j.swaps_out for j in done),
        "swaps_in": sum(j.swaps_in for j in done),
        "recomputes": sum(j.recomputes for j in done),
        "promotions": sum(j.promotions for j in done),
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
