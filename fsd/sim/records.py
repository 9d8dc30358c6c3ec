"""Per-job records of one simulated run, as CSV: what each request saw.

The metric row says how a policy did; these rows say to whom. A tail is read from
them: which jobs make up the P95, when they arrived, how long they waited for the
first token, the longest stall between two of their tokens (`tbt_max_s`), how often
they were preempted, swapped or promoted.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path

from fsd.sim.job import SimJob

COLUMNS = (
    "job_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "ttft_s",
    "finish_s",
    "latency_s",
    "per_token_s",
    "tbt_max_s",
    "preemptions",
    "swaps_out",
    "swaps_in",
    "recomputes",
    "promotions",
    "demotions",
)


def job_row(job: SimJob) -> tuple:
    """One finished job's record, in COLUMNS order (times in seconds)."""
    return (
        job.job_id,
        job.arrival_time,
        job.prompt_len,
        job.max_output,
        job.ttft,
        job.finish_time,
        job.latency,
        job.per_token_latency,
        job.max_gap,
        job.preemptions,
        job.swaps_out,
        job.swaps_in,
        job.recomputes,
        job.promotions,
        job.demotions,
    )


def write_jobs_csv(path: Path, jobs: Iterable[SimJob]) -> int:
    """Write the served jobs' records (arrival order; a refused one has none) to `path`;
    returns the number of rows."""
    rows: Sequence[tuple] = sorted((job_row(j) for j in jobs if not j.refused), key=lambda r: r[1])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        out.writerows(rows)
    return len(rows)
