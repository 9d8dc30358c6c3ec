"""Per-job records of a played scenario and the statistics over them.

Definitions (as the simulator's, fsd/sim/metrics.py, and the paper's §6.1):
per-token latency = (finish - arrival) / output tokens; TTFT = first token - arrival;
TPOT = (finish - first token) / (tokens - 1); ITL = the gaps between a job's tokens;
a job meets the SLO when its per-token latency is at most `slo`; goodput is those
jobs per second of makespan (first arrival to last finish).

The latency split (paper Fig. 15b) of a finished job: execution = the summed
durations of the iterations that produced its tokens (from telemetry); swapping = the
time its KV spent being copied back to the device (swap-in begin to end) while it
waited; queuing = the rest of its latency.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

SPLIT = ("queuing", "execution", "swapping")


@dataclass
class JobRecord:
    """One job of a played scenario, as written to the JSONL records file."""

    index: int
    origin: str
    scheduled: float  # seconds from the start of the play
    prompt_len: int
    output_len: int  # asked for
    job_id: str | None = None
    reason: str | None = None  # length, stop, abort, error; None = never finished
    error: str | None = None
    tokens: int = 0
    arrival: float | None = None  # daemon wall clock
    first_token: float | None = None
    finish: float | None = None
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0
    swaps_out: int = 0
    swaps_in: int = 0
    recomputes: int = 0
    execution: float | None = None
    swapping: float | None = None
    queuing: float | None = None

    @property
    def latency(self) -> float | None:
        return _since(self.arrival, self.finish)

    @property
    def per_token_latency(self) -> float | None:
        lat = self.latency
        return None if lat is None or not self.tokens else lat / self.tokens

    @property
    def ttft(self) -> float | None:
        return _since(self.arrival, self.first_token)

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or self.finish is None or self.tokens < 2:
            return None
        return (self.finish - self.first_token) / (self.tokens - 1)

    @property
    def completed(self) -> bool:
        return self.reason in ("length", "stop")

    def to_dict(self, with_token_times: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_token_times:
            d.pop("token_times")
        d.update(
            latency=self.latency,
            per_token_latency=self.per_token_latency,
            ttft=self.ttft,
            tpot=self.tpot,
        )
        return d


def _since(start: float | None, end: float | None) -> float | None:
    """Seconds from `start` to `end` (None: either is unknown)."""
    return None if start is None or end is None else end - start


def split_latency(
    records: Iterable[JobRecord],
    iterations: dict[float, float],
    swap_in: dict[str, float],
) -> None:
    """Fill each finished record's queuing / execution / swapping seconds.

    `iterations` maps an iteration's end time to its duration; a token whose
    iteration is missing (telemetry dropped it) is charged the median duration.
    `swap_in` holds each job's seconds of swap-in copies.
    """
    if not iterations:
        return
    ends = np.array(sorted(iterations))
    durs = np.array([iterations[e] for e in ends])
    typical = float(np.median(durs))
    for r in records:
        lat = r.latency
        if lat is None or not r.token_times or r.job_id is None:
            continue
        t = np.asarray(r.token_times)
        i = np.clip(np.searchsorted(ends, t), 0, len(ends) - 1)
        j = np.clip(i - 1, 0, len(ends) - 1)
        best = np.where(np.abs(ends[i] - t) <= np.abs(ends[j] - t), i, j)
        hit = np.abs(ends[best] - t) <= 1e-4
        execution = float(np.where(hit, durs[best], typical).sum())
        execution = min(execution, lat)
        swapping = min(swap_in.get(r.job_id, 0.0), lat - execution)
        r.execution, r.swapping = execution, swapping
        r.queuing = max(0.0, lat - execution - swapping)


def _stat(values: Sequence[float], q: float | None = None) -> float:
    if not len(values):
        return math.nan
    return float(np.percentile(values, q)) if q is not None else float(np.mean(values))


def summarize(records: Sequence[JobRecord], slo: float | None) -> dict[str, Any]:
    """The summary row of one play (latencies in seconds)."""
    done = [r for r in records if r.completed and r.per_token_latency is not None]
    ptl = [r.per_token_latency for r in done]
    ttft = [r.ttft for r in done if r.ttft is not None]
    tpot = [r.tpot for r in done if r.tpot is not None]
    itl = [float(g) for r in done for g in np.diff(r.token_times)]
    starts = [r.arrival for r in done if r.arrival is not None]
    ends = [r.finish for r in done if r.finish is not None]
    makespan = max(ends) - min(starts) if done else math.nan
    met = sum(1 for x in ptl if slo is not None and x <= slo)  # type: ignore[operator]
    out: dict[str, Any] = {
        "jobs": len(records),
        "finished": len(done),
        "aborted": sum(1 for r in records if r.reason == "abort"),
        "failed": sum(1 for r in records if r.reason not in ("length", "stop", "abort")),
        "avg": _stat(ptl),
        "p50": _stat(ptl, 50),
        "p95": _stat(ptl, 95),
        "p99": _stat(ptl, 99),
        "ttft": _stat(ttft),
        "ttft_p95": _stat(ttft, 95),
        "tpot": _stat(tpot),
        "tpot_p95": _stat(tpot, 95),
        "itl": _stat(itl),
        "itl_p95": _stat(itl, 95),
        "slo": slo,
        "slo_attainment": met / len(done) if done and slo is not None else math.nan,
        "goodput": met / makespan if done and makespan > 0 and slo is not None else math.nan,
        "throughput_rps": len(done) / makespan if done and makespan > 0 else math.nan,
        "makespan_s": makespan,
        "preemptions": sum(r.preemptions for r in records),
        "swaps": sum(r.swaps_out + r.swaps_in for r in records),
        "recomputes": sum(r.recomputes for r in records),
    }
    split = [r for r in done if r.execution is not None]
    if split:
        total = sum(r.latency or 0.0 for r in split) or 1.0
        for part in SPLIT:
            seconds = sum(getattr(r, part) for r in split)
            out[f"{part}_s"] = seconds / len(split)
            out[f"{part}_frac"] = seconds / total
    return out
