"""`fsd simulate`: replay a trace or a synthetic workload through several policies.

The command function lives here (registered on the `fsd` app by `fsd/cli.py`); what
it runs is in `cli_run`, where its workload comes from in `cli_workload`, what it
prints in `cli_report`. Options that set a config field take the config's default
(`default_of`), and the help names the registries' entries, so neither is retyped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from fsd.cli_errors import fail, friendly
from fsd.cli_options import default_of, one_of
from fsd.config import CacheConfig, SchedConfig
from fsd.kv.registry import KV_POLICIES
from fsd.sched.registry import POLICIES, SLO_DECODE_STEPS, STARVE_LIMIT_SLOS, WAITING_LIMIT_SLOS
from fsd.sim.cli_run import SimOptions, simulate
from fsd.sim.cli_workload import DEFAULT_RATE, DEFAULT_REQUESTS
from fsd.workload.arrivals import ARRIVALS
from fsd.workload.lengths import PRESETS as LENGTH_MODELS

DEFAULT_POLICIES = ",".join(POLICIES)
DEFAULT_PROFILE = "opt-13b-a100"


def simulate_command(
    scenario: Annotated[
        Path | None,
        typer.Argument(help="A scenario TOML file (man fsd-scenario) to simulate."),
    ] = None,
    length_scale: Annotated[
        float, typer.Option(help="Scenario only: multiply every job's token counts.")
    ] = 1.0,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Trace: Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake .jsonl."
        ),
    ] = None,
    time_scale: Annotated[
        float, typer.Option(help="Trace rate multiplier: 0.5 = half the rate (gaps x2).")
    ] = 1.0,
    limit: Annotated[
        int | None,
        typer.Option(
            help="A trace's or scenario's first N requests (default: all of them), or N "
            f"synthetic requests (default {DEFAULT_REQUESTS})."
        ),
    ] = None,
    arrival: Annotated[
        str | None, typer.Option(help=f"Synthetic arrivals: {one_of(ARRIVALS)}.")
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(help=f"Synthetic arrival rate, requests/s (default {DEFAULT_RATE:g})."),
    ] = None,
    cv: Annotated[
        float | None, typer.Option(help="Inter-arrival coefficient of variation (gamma).")
    ] = None,
    lengths: Annotated[
        str | None,
        typer.Option(help=f"{one_of([*LENGTH_MODELS, 'mix:A+B:W (W from A)'])}."),
    ] = None,
    theta: Annotated[float | None, typer.Option(help="Zipf skew for --lengths zipf.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic workload.")] = 0,
    max_context: Annotated[
        int | None,
        typer.Option(
            help="Clip requests to this many tokens (default: the profile's context; 0 = no clip)."
        ),
    ] = None,
    no_clip: Annotated[
        bool,
        typer.Option(
            "--no-clip", help="Refuse a workload with requests past the context; do not clip."
        ),
    ] = False,
    policies: Annotated[
        str,
        typer.Option(help=f"Comma-separated policies ({', '.join((*POLICIES, 'default'))})."),
    ] = DEFAULT_POLICIES,
    profile: Annotated[
        str, typer.Option(help="Shipped profile name or profile JSON path.")
    ] = DEFAULT_PROFILE,
    pp: Annotated[
        int | None,
        typer.Option(
            help="Pipeline stages: micro-batches in flight (default: the profile's; 1 = none)."
        ),
    ] = None,
    max_batch_size: Annotated[int, typer.Option(help="Most jobs per iteration.")] = default_of(
        SchedConfig, "max_batch_size"
    ),
    max_batch_tokens: Annotated[
        int | None,
        typer.Option(
            help="Most new tokens per iteration (default: "
            f"max({default_of(SchedConfig, 'max_batch_tokens')}, longest request))."
        ),
    ] = None,
    kv_policy: Annotated[str, typer.Option(help=f"{one_of(KV_POLICIES)}.")] = default_of(
        CacheConfig, "kv_policy"
    ),
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = default_of(
        CacheConfig, "block_size"
    ),
    num_gpu_blocks: Annotated[
        int | None, typer.Option(help="Device KV blocks (default: from the profile).")
    ] = default_of(CacheConfig, "num_gpu_blocks"),
    num_host_blocks: Annotated[
        int | None, typer.Option(help="Host KV blocks (default: 4 x device).")
    ] = default_of(CacheConfig, "num_host_blocks"),
    q1: Annotated[
        float | None, typer.Option(help="Top-level quantum, s (default: a decode step).")
    ] = default_of(SchedConfig, "q1"),
    quantum_ratio: Annotated[float, typer.Option(help="q(k+1) / q(k).")] = default_of(
        SchedConfig, "quantum_ratio"
    ),
    num_levels: Annotated[int, typer.Option(help="MLFQ levels.")] = default_of(
        SchedConfig, "num_levels"
    ),
    starve_limit: Annotated[
        Optional[float],  # noqa: UP045 - typer reads the annotation at run time
        typer.Option(help=f"Alpha, s (default: the policy's; fsd {STARVE_LIMIT_SLOS} x the SLO)."),
    ] = default_of(SchedConfig, "starve_limit"),
    starve_limit_waiting: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            help=f"Alpha for jobs not yet started, s (fsd: {WAITING_LIMIT_SLOS} x the SLO)."
        ),
    ] = default_of(SchedConfig, "starve_limit_waiting"),
    starve_promote: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Where starved jobs go: up1 (one level, fsd), top (Q1, paper) or entry."),
    ] = default_of(SchedConfig, "starve_promote"),
    charge_prefill: Annotated[
        Optional[bool],  # noqa: UP045
        typer.Option(help="Charge a prefill as attained service (the paper's rule; fsd: no)."),
    ] = default_of(SchedConfig, "charge_prefill"),
    demote_rule: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="At a quantum's end: gittins (learned lengths, fsd) or always (paper)."),
    ] = default_of(SchedConfig, "demote_rule"),
    preempt_threshold: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="Levels the running jobs rank above their own (fsd 3; paper 0)."),
    ] = default_of(SchedConfig, "preempt_threshold"),
    swap_gate: Annotated[
        Optional[bool],  # noqa: UP045
        typer.Option(
            help="Start work only while it fits the device; swap only when it pays (fsd)."
        ),
    ] = default_of(SchedConfig, "swap_gate"),
    prefill_chunk: Annotated[
        Optional[int],  # noqa: UP045 - typer reads the annotation at run time
        typer.Option(
            help="Chunked prefill: most prompt tokens an iteration carries beside its "
            "decodes (0 = whole prefills; else at least --block-size; unset: the most "
            "whose prefill fits the SLO)."
        ),
    ] = default_of(SchedConfig, "prefill_chunk"),
    admit_fraction: Annotated[
        float, typer.Option(help="New jobs start while device+host KV use stays under this.")
    ] = default_of(CacheConfig, "admit_fraction"),
    prefix_cache: Annotated[
        bool,
        typer.Option(help="Reuse cached prefix blocks (a trace's prefix hashes: Mooncake)."),
    ] = default_of(CacheConfig, "prefix_cache"),
    reserve_min_jobs: Annotated[
        int, typer.Option(help="K: reserve room for at least K new jobs.")
    ] = default_of(CacheConfig, "reserve_min_jobs"),
    reserve_top_levels: Annotated[
        int, typer.Option(help="K': or for the jobs in the top K' levels.")
    ] = default_of(CacheConfig, "reserve_top_levels"),
    slo: Annotated[
        float | None,
        typer.Option(
            help=f"Per-token latency SLO, s (default {SLO_DECODE_STEPS} x a decode step)."
        ),
    ] = None,
    sweep: Annotated[
        bool,
        typer.Option(
            help="Find each policy's max sustainable rate under the SLO and its P95 goodput "
            "(bisection)."
        ),
    ] = False,
    sweep_metric: Annotated[
        str, typer.Option(help="Latency statistic the SLO bounds: avg, p50, p95 or p99.")
    ] = "avg",
    sweep_tol: Annotated[float, typer.Option(help="Stop when hi / lo <= 1 + tol.")] = 0.05,
    sweep_goodput: Annotated[
        bool,
        typer.Option(
            help="With --sweep: also the P95 goodput (95% of jobs within 10 x the "
            "light-load TTFT and TPOT)."
        ),
    ] = True,
    kv_sample: Annotated[
        float | None, typer.Option(help="Record KV usage every S seconds into the JSON.")
    ] = None,
    jobs: Annotated[int, typer.Option(help="Worker processes (runs are independent).")] = 1,
    jobs_csv: Annotated[
        Path | None,
        typer.Option(help="Write every job's record to DIR/<policy>.csv (not with --sweep)."),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the results as JSON here.")
    ] = None,
) -> None:
    """Simulate serving a workload under several scheduling policies; print and save metrics."""
    options = SimOptions(**locals())  # every parameter, by name (first: nothing else yet)
    with friendly():
        report = simulate(options)
    if json_out is not None:
        try:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(report, indent=2, default=float) + "\n")
        except OSError as exc:
            fail(f"cannot write {json_out}: {exc.strerror}")
