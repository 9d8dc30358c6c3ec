"""`fsd bench`: benchmarks against real daemons (registered on the `fsd` app)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from fsd.cli_errors import friendly

bench_app = typer.Typer(help="Benchmarks against real daemons.", no_args_is_help=True)


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


def _floats(text: str, name: str) -> tuple[float, ...]:
    from fsd.errors import ConfigError

    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{name} must be comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise ConfigError(f"{name} must list rates > 0, got {text!r}")
    return tuple(sorted(set(values)))


@bench_app.command("slo")
def slo_command(
    scenario: Annotated[Path, typer.Option(help="Scenario TOML whose rate is swept.")],
    rates: Annotated[str, typer.Option(help="Comma-separated arrival rates, jobs/s.")],
    policies: Annotated[str, typer.Option(help="Comma-separated policies.")] = "fcfs,sj-mlfq",
    duration: Annotated[
        Optional[float], typer.Option(help="Cut the scenario to this many seconds.")  # noqa: UP045
    ] = None,
    time_scale: Annotated[float, typer.Option(help="Play S times faster.")] = 1.0,
    length_scale: Annotated[float, typer.Option(help="Multiply token counts.")] = 1.0,
    drain_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for jobs after the last arrival.")
    ] = 120.0,
    slo: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(help="Per-token latency SLO, s (default: the daemon's, 10 decode steps)."),
    ] = None,
    metric: Annotated[str, typer.Option(help="What the SLO bounds: avg or p95.")] = "avg",
    model: Annotated[str, typer.Option(help="Preset name or HuggingFace directory.")] = "tiny",
    device: Annotated[Optional[str], typer.Option(help="auto, cpu or cuda.")] = None,  # noqa: UP045
    kv_policy: Annotated[Optional[str], typer.Option(help="KV policy of the daemons.")] = None,  # noqa: UP045
    max_batch_size: Annotated[Optional[int], typer.Option(help="Most jobs per iteration.")] = None,  # noqa: UP045
    num_gpu_blocks: Annotated[Optional[int], typer.Option(help="Device KV blocks.")] = None,  # noqa: UP045
    num_host_blocks: Annotated[Optional[int], typer.Option(help="Host KV blocks.")] = None,  # noqa: UP045
    profile: Annotated[Optional[str], typer.Option(help="Cost-model JSON for the daemons.")] = None,  # noqa: UP045
    config: Annotated[Optional[str], typer.Option(help="fsd.toml for the daemons.")] = None,  # noqa: UP045
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            help="Output prefix: PREFIX.json and PREFIX-*.png (default: a new "
            "slo-DEVICE-YYYYmmdd-HHMMSS in the working folder; an existing PREFIX is replaced)."
        ),
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write the PNG plots.")] = True,
) -> None:
    """Latency against arrival rate per policy on the real engine (a fresh daemon per
    policy); writes JSON and PNG plots, prints the max rate under the SLO."""
    from fsd.bench.daemon import DaemonSpec
    from fsd.bench.slo import SloBench, run
    from fsd.console.play import PlayOptions
    from fsd.errors import ConfigError
    from fsd.workload.scenario import load_scenario

    console = Console() if Console().is_terminal else Console(width=200)
    with friendly():
        names = tuple(dict.fromkeys(p.strip() for p in policies.split(",") if p.strip()))
        if not names:
            raise ConfigError("--policies names no policy")
        bench = SloBench(
            scenario=load_scenario(scenario),
            policies=names,
            rates=_floats(rates, "--rates"),
            daemon=DaemonSpec(
                names[0],
                model,
                device,
                kv_policy,
                max_batch_size,
                num_gpu_blocks,
                num_host_blocks,
                profile,
                config,
            ),
            play=PlayOptions(
                time_scale=time_scale,
                length_scale=length_scale,
                duration=duration,
                drain_timeout=drain_timeout,  # progress: a bar on a terminal, else lines
            ),
            slo=slo,
            metric=metric,
        )
        report = run(bench, console)
    prefix = out or default_prefix(report["machine"]["device"])
    prefix.parent.mkdir(parents=True, exist_ok=True)
    path = prefix.with_name(prefix.name + ".json")
    path.write_text(json.dumps(report, indent=1, default=float) + "\n")
    console.print(f"wrote {path}", highlight=False)
    if plots:
        from fsd.bench.plots import write_plots

        for png in write_plots(report, prefix):
            console.print(f"wrote {png}", highlight=False)
