"""Latency against arrival rate per policy, on the real engine (a fresh daemon per policy).

    .venv/bin/python bench/slo.py --scenario scenarios/steady-sharegpt.toml --rates 1.5,3,4.5,6
    .venv/bin/python bench/slo.py --scenario S --rates 10,20 --duration 15 --out PREFIX

For each policy a fresh daemon starts; the scenario is played at each rate (every
phase's rate scaled so the scenario's own arrivals average that rate, the same seed,
so both policies see the same jobs at a rate); the daemon is idle again before the
next rate. One SLO judges every run: `--slo`, or the first daemon's (10 decode steps
of its cost model). A policy's max rate under the SLO is where its average per-token
latency crosses the SLO, interpolated linearly between the tested rates.

Writes PREFIX.json and the PNG plots PREFIX-*.png (bench/slo_plots.py); without --out
PREFIX is a new slo-DEVICE-YYYYmmdd-HHMMSS in the working folder, so that a trial run
never replaces the committed bench/results/slo-cpu (regenerate that one with --out
bench/results/slo-cpu). Prints the max rate under the SLO of each policy.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from daemon import BenchDaemon, DaemonSpec  # noqa: E402

from fsd.console.play import PlayOptions, play, prepare, summary_table  # noqa: E402
from fsd.console.play_stats import summarize  # noqa: E402
from fsd.credentials import read_secret, token_path  # noqa: E402
from fsd.errors import ConfigError, FsdError  # noqa: E402
from fsd.workload.scenario import Scenario, load_scenario  # noqa: E402


@dataclass(frozen=True)
class SloBench:
    """One benchmark: the scenario, the rates, the daemons' settings, the player's."""

    scenario: Scenario
    policies: tuple[str, ...]
    rates: tuple[float, ...]
    daemon: DaemonSpec
    play: PlayOptions
    slo: float | None = None
    metric: str = "avg"


def base_rate(scenario: Scenario, opts: PlayOptions) -> float:
    """The mean rate (jobs/s) of the scenario's phases as `opts` plays them (no bursts)."""
    timeline = prepare(scenario, replace(opts, rate_factor=1.0))
    phase_names = {p.name for p in scenario.phases}
    n = sum(1 for a in timeline.arrivals if a.origin in phase_names)
    if n == 0:
        raise ConfigError(f"{scenario.source}: the scenario's phases make no jobs to scale")
    return n / timeline.duration


def operator_token(d: BenchDaemon) -> str | None:
    """The bench daemon's own operator token (from its state folder), so that a scenario's
    retune and inject events are allowed; not FSD_TOKEN, which names another daemon's.
    None when the daemon wrote none."""
    path = token_path(d.state_dir, d.endpoint)
    return read_secret(path, "operator token file") if path.is_file() else None


def run(bench: SloBench, console: Console) -> dict[str, Any]:
    """Every policy at every rate; the report that `write_report` saves."""
    if bench.metric not in ("avg", "p95"):
        raise ConfigError(f"metric must be avg or p95, got {bench.metric!r}")
    base = base_rate(bench.scenario, bench.play)
    slo = bench.slo
    policies: dict[str, dict[str, Any]] = {}
    for policy in bench.policies:
        runs, slo = _run_policy(bench, policy, base, slo, console)
        policies[policy] = {"runs": runs}
    if slo is None:
        raise ConfigError("no SLO: the daemon sent no telemetry; give --slo")
    for row in policies.values():
        for r in row["runs"]:
            r.update(summarize(r.pop("records"), slo))
        row.update(max_rate_under(row["runs"], slo, bench.metric))
    report = _report(bench, base, slo, policies)
    _print_summary(bench, slo, report, console)
    return report


def _run_policy(
    bench: SloBench, policy: str, base: float, slo: float | None, console: Console
) -> tuple[list[dict[str, Any]], float | None]:
    """One policy at every rate on a fresh daemon: its runs (records not yet summarised),
    and the SLO (the daemon's when none was given yet)."""
    runs = []
    console.print(f"[bold]{policy}[/]: starting a fresh daemon", highlight=False)
    with BenchDaemon(replace(bench.daemon, policy=policy)) as d:
        token = operator_token(d)
        for rate in bench.rates:
            opts = replace(bench.play, rate_factor=rate / base, tag=f"bench-{policy}")
            timeline = prepare(bench.scenario, opts)
            result = play(
                timeline,
                d.endpoint,
                d.telemetry,
                opts,
                timeout=30.0,
                token=token,
                label=f"{policy} @ {rate:g}/s",
            )
            if slo is None:
                slo = result.telemetry.slo
            d.wait_idle()
            runs.append(
                {
                    "rate": rate,
                    "offered_rate": len(timeline.arrivals) / timeline.duration,
                    "wall_s": result.wall_s,
                    "records": result.records,
                    "kv_series": result.telemetry.kv_series(result.started),
                }
            )
            done = sum(1 for r in result.records if r.completed)
            console.print(
                f"  {policy} @ {rate:g}/s: {done}/{len(result.records)} jobs, "
                f"avg {result.summary['avg'] * 1e3:.1f} ms/token, wall {result.wall_s:.0f} s",
                highlight=False,
            )
    return runs, slo


def _report(
    bench: SloBench, base: float, slo: float, policies: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The saved report; with two policies or more, the last's max rate over the first's."""
    report = {
        "machine": daemon_machine(bench.daemon.device),
        "scenario": bench.scenario.name,
        "scenario_source": bench.scenario.source,
        "base_rate": base,
        "slo": slo,
        "metric": bench.metric,
        "daemon": asdict(bench.daemon) | {"policy": None},
        "play": asdict(bench.play),
        "policies": policies,
    }
    names = list(policies)
    if len(names) >= 2:
        a, b = policies[names[0]]["max_rate"], policies[names[-1]]["max_rate"]
        report["ratio"] = {
            "of": f"{names[-1]} / {names[0]}",
            "value": b / a if a and a > 0 and not math.isnan(b) else None,
        }
    return report


def _print_summary(bench: SloBench, slo: float, report: dict[str, Any], console: Console) -> None:
    """The table of every run, each policy's max rate under the SLO, and the ratio."""
    policies = report["policies"]
    table_rows = {f"{p} @ {r['rate']:g}/s": r for p, row in policies.items() for r in row["runs"]}
    console.print(summary_table(table_rows, f"{bench.scenario.name}: SLO {slo * 1e3:.1f} ms/token"))
    for p, row in policies.items():
        sign = "" if row["bracketed"] else ">= " if row["max_rate"] else "< "
        shown = row["max_rate"] or (min(bench.rates) if bench.rates else 0.0)
        console.print(f"{p}: max rate under the SLO {sign}{shown:.2f} jobs/s", highlight=False)
    if report.get("ratio", {}).get("value"):
        console.print(f"ratio {report['ratio']['of']}: {report['ratio']['value']:.2f}x")


def max_rate_under(runs: list[dict[str, Any]], slo: float, metric: str) -> dict[str, Any]:
    """The rate where `metric` latency first exceeds `slo`, interpolated between the last
    rate that met it and the first that did not.

    `bracketed` is False when every rate met the SLO (the max is at least the highest
    rate) or the lowest already failed (max_rate 0).
    """
    pts = sorted((r["rate"], r[metric]) for r in runs)
    fail = next((i for i, (_, lat) in enumerate(pts) if not lat <= slo), None)  # NaN fails
    if fail is None:
        return {"max_rate": pts[-1][0] if pts else 0.0, "bracketed": False}
    if fail == 0:
        return {"max_rate": 0.0, "bracketed": False}
    (r0, l0), (r1, l1) = pts[fail - 1], pts[fail]
    if math.isnan(l1):
        return {"max_rate": r0, "bracketed": True}
    return {"max_rate": r0 + (slo - l0) * (r1 - r0) / (l1 - l0), "bracketed": True}


def daemon_machine(device: str | None) -> dict[str, Any]:
    """The machine the daemon ran on: its GPU when it used one (torch is imported lazily)."""
    import torch

    cuda = torch.cuda.is_available() and device in (None, "auto", "cuda")
    return machine.describe_machine(torch.device("cuda" if cuda else "cpu"))


def default_prefix(device: str, now: float | None = None, folder: Path = Path(".")) -> Path:
    """Where a run writes without --out: slo-DEVICE-YYYYmmdd-HHMMSS in the working folder.

    Why not bench/results/slo-DEVICE: that is the committed run the README shows, and a
    trial run must not replace it (regenerating it takes `--out bench/results/slo-cpu`).
    A name already taken (two runs in one second) gets -2, -3, ...
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = folder / f"slo-{device}-{stamp}"
    prefix, n = base, 1
    while prefix.with_name(prefix.name + ".json").exists():
        n += 1
        prefix = base.with_name(f"{base.name}-{n}")
    return prefix


def _rates(text: str) -> tuple[float, ...]:
    """--rates: comma-separated rates > 0, sorted, each once."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated numbers wanted, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"rates > 0 wanted, got {text!r}")
    return tuple(sorted(set(values)))


def _names(text: str) -> tuple[str, ...]:
    """--policies: comma-separated names, each once, in order."""
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not names:
        raise argparse.ArgumentTypeError("no policy named")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = ap.add_argument
    add("--scenario", type=Path, required=True, help="scenario TOML whose rate is swept")
    add("--rates", type=_rates, required=True, help="comma-separated arrival rates, jobs/s")
    add(
        "--policies",
        type=_names,
        default=("fcfs", "sj-mlfq"),
        help="comma-separated policies (default fcfs,sj-mlfq)",
    )
    add("--duration", type=float, help="cut the scenario to this many seconds")
    add("--time-scale", type=float, default=1.0, help="play S times faster")
    add("--length-scale", type=float, default=1.0, help="multiply token counts")
    add("--drain-timeout", type=float, default=120.0, help="seconds to wait after the last arrival")
    add(
        "--slo",
        type=float,
        help="per-token latency SLO, s (default: the daemon's, 10 decode steps)",
    )
    add("--metric", default="avg", choices=("avg", "p95"), help="what the SLO bounds")
    add("--model", default="tiny", help="preset name or HuggingFace directory")
    add("--device", help="auto, cpu or cuda (default: the daemon's)")
    for flag in ("--kv-policy", "--profile", "--config"):
        add(flag, help=f"{flag} of the daemons (fsd start)")
    for flag in ("--max-batch-size", "--num-gpu-blocks", "--num-host-blocks"):
        add(flag, type=int, help=f"{flag} of the daemons (fsd start)")
    add("--out", type=Path, help="output prefix: PREFIX.json and PREFIX-*.png (see above)")
    add("--plots", action=argparse.BooleanOptionalAction, default=True, help="write the PNG plots")
    return ap.parse_args(argv)


def bench_of(args: argparse.Namespace) -> SloBench:
    """The benchmark the command line asks for."""
    spec = DaemonSpec(
        args.policies[0], args.model, args.device, args.kv_policy, args.max_batch_size,
        args.num_gpu_blocks, args.num_host_blocks, args.profile, args.config,
    )  # fmt: skip
    play = PlayOptions(
        time_scale=args.time_scale,
        length_scale=args.length_scale,
        duration=args.duration,
        drain_timeout=args.drain_timeout,  # progress: a bar on a terminal, else lines
    )
    return SloBench(
        load_scenario(args.scenario), args.policies, args.rates, spec, play, args.slo, args.metric
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    console = Console() if Console().is_terminal else Console(width=200)
    try:
        report = run(bench_of(args), console)
    except FsdError as exc:  # a deliberate error: one line, exit 2 (as fsd's commands)
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    prefix = args.out or default_prefix(report["machine"]["device"])
    prefix.parent.mkdir(parents=True, exist_ok=True)
    path = prefix.with_name(prefix.name + ".json")
    path.write_text(json.dumps(report, indent=1, default=float) + "\n")
    console.print(f"wrote {path}", highlight=False)
    if args.plots:
        from slo_plots import write_plots

        for png in write_plots(report, prefix):
            console.print(f"wrote {png}", highlight=False)


if __name__ == "__main__":
    main()
