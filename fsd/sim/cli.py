"""`fsd simulate`: replay a trace or a synthetic workload through several policies.

The command function lives here (registered on the `fsd` app by `fsd/cli.py`); heavy
imports happen inside it so `fsd --help` stays fast. A workload comes from exactly one
source, chosen in `load_workload`: `--trace FILE`, or the synthetic generator
(`--arrival/--rate/--cv/--lengths`), or a scenario file (positional SCENARIO, see
man/fsd-scenario.5), expanded into the very jobs `fsctl play` submits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from fsd.errors import FsdError

err = Console(stderr=True)
DEFAULT_POLICIES = "fcfs,priority,mlfq,sj-mlfq,srpt"
DEFAULT_PROFILE = "opt-13b-a100"


def load_workload(
    trace: Path | None,
    time_scale: float,
    limit: int | None,
    arrival: str | None,
    rate: float | None,
    cv: float | None,
    lengths: str | None,
    theta: float | None,
    seed: int,
    max_context: int | None,
) -> Any:
    """The workload of one `simulate` call, clipped to `max_context` (None: no clip)."""
    from fsd.errors import ConfigError
    from fsd.workload import length_model, make_arrivals, read_trace, synthetic

    if trace is not None:
        given = [
            n
            for n, v in (
                ("--arrival", arrival),
                ("--rate", rate),
                ("--cv", cv),
                ("--lengths", lengths),
                ("--theta", theta),
            )
            if v is not None
        ]
        if given:
            raise ConfigError(
                f"{', '.join(given)} describe a synthetic workload; with --trace use --time-scale"
            )
        workload = read_trace(trace, time_scale=time_scale, limit=limit)
    else:
        if time_scale != 1.0:
            raise ConfigError("--time-scale applies to --trace; a synthetic workload takes --rate")
        process = make_arrivals(arrival or "poisson", 1.0 if rate is None else rate, cv)
        model = length_model(lengths or "sharegpt", theta)
        workload = synthetic(process, model, limit or 2000, seed)
    return workload.clipped(max_context)


def load_scenario_workload(
    path: Path,
    time_scale: float,
    length_scale: float,
    limit: int | None,
    given: dict[str, Any],
    max_context: int | None,
) -> Any:
    """The jobs of a scenario file as a workload; its timed retune / abort-all actions
    are returned beside it (the simulator runs one configuration, so they are reported,
    not applied)."""
    from fsd.errors import ConfigError
    from fsd.workload.scenario import load_scenario
    from fsd.workload.timeline import expand

    clash = [name for name, value in given.items() if value is not None]
    if clash:
        raise ConfigError(
            f"{', '.join(clash)} describe another workload; a scenario brings its own "
            "(use --time-scale, --length-scale and --limit with it)"
        )
    timeline = expand(load_scenario(path).scaled(time_scale, length_scale))
    if not timeline.arrivals:
        raise ConfigError(f"{path}: the scenario makes no jobs")
    workload = timeline.workload()
    if limit is not None:
        workload = workload.head(limit)
    return workload.clipped(max_context), timeline.actions


def simulate_command(
    scenario: Annotated[
        Path | None,
        typer.Argument(help="A scenario TOML file (man fsd-scenario) to simulate."),
    ] = None,
    length_scale: Annotated[
        float, typer.Option(help="Scenario only: multiply every job's token counts.")
    ] = 1.0,
    trace: Annotated[
        Path | None, typer.Option(help="Trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens).")
    ] = None,
    time_scale: Annotated[
        float, typer.Option(help="Trace rate multiplier: 0.5 = half the rate (gaps x2).")
    ] = 1.0,
    limit: Annotated[
        int | None,
        typer.Option(help="First N trace requests / N synthetic requests (default 2000)."),
    ] = None,
    arrival: Annotated[
        str | None, typer.Option(help="Synthetic arrivals: poisson, gamma or uniform.")
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="Synthetic arrival rate, requests/s (default 1).")
    ] = None,
    cv: Annotated[
        float | None, typer.Option(help="Inter-arrival coefficient of variation (gamma).")
    ] = None,
    lengths: Annotated[
        str | None, typer.Option(help="sharegpt, alpaca, azure-conv, prefill-heavy or zipf.")
    ] = None,
    theta: Annotated[float | None, typer.Option(help="Zipf skew for --lengths zipf.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic workload.")] = 0,
    max_context: Annotated[
        int | None,
        typer.Option(
            help="Clip requests to this many tokens (default: the profile's context; 0 = no clip)."
        ),
    ] = None,
    policies: Annotated[
        str,
        typer.Option(
            help="Comma-separated policies (fcfs, priority, mlfq, sj-mlfq, srpt, default)."
        ),
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
    max_batch_size: Annotated[int, typer.Option(help="Most jobs per iteration.")] = 32,
    max_batch_tokens: Annotated[
        int | None,
        typer.Option(help="Most new tokens per iteration (default: max(4096, longest request))."),
    ] = None,
    kv_policy: Annotated[
        str, typer.Option(help="defer, recompute, reactive or proactive.")
    ] = "proactive",
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    num_gpu_blocks: Annotated[
        int | None, typer.Option(help="Device KV blocks (default: from the profile).")
    ] = None,
    num_host_blocks: Annotated[
        int | None, typer.Option(help="Host KV blocks (default: 4 x device).")
    ] = None,
    q1: Annotated[
        float | None, typer.Option(help="Top-level quantum, s (default: a decode step).")
    ] = None,
    quantum_ratio: Annotated[float, typer.Option(help="q(k+1) / q(k).")] = 2.0,
    num_levels: Annotated[int, typer.Option(help="MLFQ levels.")] = 8,
    starve_limit: Annotated[
        float | None, typer.Option(help="Alpha, s (default: 100 x the SLO).")
    ] = None,
    starve_limit_waiting: Annotated[
        float | None,
        typer.Option(help="Alpha for jobs not yet started, s (default: 8 x the SLO)."),
    ] = None,
    starve_promote: Annotated[
        str, typer.Option(help="Where starved jobs go: up1 (one level), top (Q1) or entry.")
    ] = "up1",
    charge_prefill: Annotated[
        bool, typer.Option(help="Charge a prefill as attained service (the paper's rule).")
    ] = False,
    demote_rule: Annotated[
        str,
        typer.Option(help="At a quantum's end: gittins (learned lengths) or always demote."),
    ] = "gittins",
    preempt_threshold: Annotated[
        int,
        typer.Option(help="Levels the running jobs rank above their own (0: any higher preempts)."),
    ] = 3,
    admit_fraction: Annotated[
        float, typer.Option(help="New jobs start while device+host KV use stays under this.")
    ] = 0.9,
    reserve_min_jobs: Annotated[
        int, typer.Option(help="K: reserve room for at least K new jobs.")
    ] = 4,
    reserve_top_levels: Annotated[
        int, typer.Option(help="K': or for the jobs in the top K' levels.")
    ] = 2,
    slo: Annotated[
        float | None, typer.Option(help="Per-token latency SLO, s (default 10 x a decode step).")
    ] = None,
    sweep: Annotated[
        bool, typer.Option(help="Find each policy's max rate under the SLO (bisection).")
    ] = False,
    sweep_metric: Annotated[
        str, typer.Option(help="Latency statistic the SLO bounds: avg, p50, p95 or p99.")
    ] = "avg",
    sweep_tol: Annotated[float, typer.Option(help="Stop when hi / lo <= 1 + tol.")] = 0.05,
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
    try:
        report = _simulate(**locals())
    except FsdError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if json_out is not None:
        try:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(report, indent=2, default=float) + "\n")
        except OSError as exc:
            err.print(f"[bold red]error:[/] cannot write {json_out}: {exc.strerror}")
            raise typer.Exit(2) from None


def _simulate(**a: Any) -> dict[str, Any]:
    from dataclasses import asdict, replace

    from fsd.config import CacheConfig, SchedConfig
    from fsd.errors import ConfigError
    from fsd.sched.profiles import load_profile
    from fsd.sched.registry import resolve_policy
    from fsd.sim.capacity import max_context_of
    from fsd.sim.engine import default_slo
    from fsd.sim.runner import RunSpec, run_many
    from fsd.sim.sweep import sweep_many

    names = [p.strip() for p in a["policies"].split(",") if p.strip()]
    if not names:
        raise ConfigError("--policies names no policy")
    for name in names:
        resolve_policy(name)
    names = list(dict.fromkeys(names))
    cost = load_profile(a["profile"])
    if a["pp"] is not None:
        if a["pp"] < 1:
            raise ConfigError(f"--pp must be >= 1, got {a['pp']}")
        # the profile's times stay the latency through the model; pp sets the overlap
        cost = replace(cost, pipeline_stages=a["pp"])
    ctx = a["max_context"]
    ctx = max_context_of(cost) if ctx is None else (ctx or None)
    actions: tuple = ()
    if a["scenario"] is not None:
        given = {"--trace": a["trace"], "--arrival": a["arrival"], "--rate": a["rate"]}
        given |= {"--cv": a["cv"], "--lengths": a["lengths"], "--theta": a["theta"]}
        workload, actions = load_scenario_workload(
            a["scenario"], a["time_scale"], a["length_scale"], a["limit"], given, ctx
        )
    elif a["length_scale"] != 1.0:
        raise ConfigError("--length-scale applies to a scenario")
    else:
        workload = load_workload(
            a["trace"],
            a["time_scale"],
            a["limit"],
            a["arrival"],
            a["rate"],
            a["cv"],
            a["lengths"],
            a["theta"],
            a["seed"],
            ctx,
        )
    _, prompts, outputs = workload.arrays()
    longest = int((prompts + outputs - 1).max())
    batch_tokens = a["max_batch_tokens"] or max(SchedConfig().max_batch_tokens, longest)
    sched = SchedConfig(
        max_batch_size=a["max_batch_size"],
        max_batch_tokens=batch_tokens,
        num_levels=a["num_levels"],
        q1=a["q1"],
        quantum_ratio=a["quantum_ratio"],
        starve_limit=a["starve_limit"],
        starve_limit_waiting=a["starve_limit_waiting"],
        starve_promote=a["starve_promote"],
        charge_prefill=a["charge_prefill"],
        demote_rule=a["demote_rule"],
        preempt_threshold=a["preempt_threshold"],
        profile=a["profile"],
    )
    cache = CacheConfig(
        block_size=a["block_size"],
        kv_policy=a["kv_policy"],
        reserve_min_jobs=a["reserve_min_jobs"],
        reserve_top_levels=a["reserve_top_levels"],
        admit_fraction=a["admit_fraction"],
    )
    slo = a["slo"] if a["slo"] is not None else default_slo(cost)
    base = RunSpec(
        "base", sched, cache, a["num_gpu_blocks"], a["num_host_blocks"], slo, a["kv_sample"]
    )
    specs = [base.with_policy(name) for name in names]
    if a["jobs_csv"] is not None:
        if a["sweep"]:
            raise ConfigError("--jobs-csv records one run per policy; --sweep makes many")
        folder = _records_dir(a["jobs_csv"])
        specs = [replace(s, jobs_csv=folder / f"{s.label}.csv") for s in specs]
    pools = specs[0].simulator(cost).pools
    summary = workload.summary()
    layout = cost.name + (
        f" ({cost.pipeline_stages} pipeline stages)" if cost.pipeline_stages > 1 else ""
    )
    _print_header(summary, layout, slo, pools, ctx, batch_tokens, a["kv_policy"])
    for act in actions:
        err.print(
            f"note: {act.kind} at {act.time:g} s {act.changes or ''} is not simulated "
            "(the simulator runs one configuration; fsctl play applies it)",
            highlight=False,
        )
    report: dict[str, Any] = {
        "workload": {**summary, **{k: v for k, v in workload.params.items() if k != "window"}},
        "unsimulated_actions": [
            {"time": x.time, "kind": x.kind, "changes": x.changes} for x in actions
        ],
        "profile": cost.name,
        "pipeline_stages": cost.pipeline_stages,
        "slo": slo,
        "max_context": ctx,
        "pools": asdict(pools),
        "sched": asdict(sched),
        "cache": asdict(cache),
    }
    if a["sweep"]:
        found = sweep_many(specs, cost, workload, a["sweep_metric"], 1.0, a["sweep_tol"], a["jobs"])
        report["sweep"] = {
            "metric": a["sweep_metric"],
            "tol": a["sweep_tol"],
            "base_rate": workload.rate,
        }
        report["policies"] = {k: r.to_dict() for k, r in found.items()}
        if a["trace"] is not None:
            for row in report["policies"].values():
                row["max_time_scale"] = row["max_scale"] * a["time_scale"]
        _print_sweep(report["policies"], a["trace"] is not None, a["time_scale"], slo)
    else:
        report["policies"] = run_many(specs, cost, workload, a["jobs"])
        _print_table(report["policies"], slo)
        if a["jobs_csv"] is not None:
            _console().print(f"per-job records: {a['jobs_csv']}/<policy>.csv", highlight=False)
    return report


def _records_dir(path: Path) -> Path:
    """The --jobs-csv directory, created now so that a bad path fails before any run."""
    from fsd.errors import ConfigError

    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--jobs-csv: cannot create {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise ConfigError(f"--jobs-csv: {path} is not writable")
    return path


def _print_header(
    summary: dict, profile: str, slo: float, pools: Any, ctx: Any, tokens: int, kv: str
) -> None:
    out = _console()
    out.print(
        f"[bold]{summary['source']}[/]: {summary['requests']} requests, "
        f"{summary.get('rate', float('nan')):.3f} req/s (cv {summary.get('cv', float('nan')):.2f}), "
        f"prompt mean {summary.get('prompt_mean', 0):.0f}, output mean {summary.get('output_mean', 0):.0f}"
        + (f", clipped to {ctx} tokens" if ctx else ""),
        highlight=False,
    )
    out.print(
        f"profile {profile}; SLO {slo * 1e3:.1f} ms/token; KV {pools.device} device + "
        f"{pools.host} host blocks ({pools.source}); kv policy {kv}; max batch tokens {tokens}",
        highlight=False,
    )


def _console() -> Console:
    """Stdout; wide enough for the table when it goes to a file or a pipe."""
    out = Console()
    return out if out.is_terminal else Console(width=160)


def _ms(x: Any) -> str:
    return f"{float(x) * 1e3:.1f}"


def _print_table(rows: dict[str, dict[str, Any]], slo: float) -> None:
    table = Table(title=f"per-token latency (ms/token), SLO {slo * 1e3:.1f} ms")
    for col in (
        "policy",
        "avg",
        "p50",
        "p95",
        "p99",
        "ttft s",
        "tpot ms",
        "goodput r/s",
        "SLO %",
        "preempt",
        "swaps",
        "peak KV",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, m in rows.items():
        table.add_row(
            name,
            _ms(m["avg"]),
            _ms(m["p50"]),
            _ms(m["p95"]),
            _ms(m["p99"]),
            f"{m['ttft']:.2f}",
            _ms(m["tpot"]),
            f"{m['goodput']:.3f}",
            f"{100 * m['slo_attainment']:.1f}",
            str(m["preemptions"]),
            str(m["swaps"]),
            str(m["peak_kv_blocks"]),
        )
    _console().print(table)


def _print_sweep(
    rows: dict[str, dict[str, Any]], trace: bool, time_scale: float, slo: float
) -> None:
    table = Table(title=f"max load with average per-token latency <= {slo * 1e3:.1f} ms")
    for col in (
        "policy",
        "max rate r/s",
        "time scale" if trace else "x base rate",
        "avg ms",
        "p95 ms",
        "runs",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, r in rows.items():
        scale = r["max_scale"] * (time_scale if trace else 1.0)
        has = r["max_scale"] > 0
        table.add_row(
            name,
            ("" if r["bracketed"] else ">=") + f"{r['max_rate']:.3f}",
            f"{scale:.3f}",
            _ms(r["avg"]) if has else "-",
            _ms(r["p95"]) if has else "-",
            str(len(r["points"])),
        )
    _console().print(table)
