"""Where `fsd simulate` gets its workload: a trace, the synthetic generator or a scenario.

A workload comes from exactly one source: `--trace FILE` (a Mooncake trace if it ends
in `.jsonl`, else an Azure CSV), or the synthetic generator
(`--arrival/--rate/--cv/--lengths`), or a scenario file (positional SCENARIO, see
man/fsd-scenario.5), expanded into the very jobs `fsctl play` submits.

Then it is fitted to the context (`fit_context`): requests longer than the model's
context are clipped and counted (stderr, and `clipped` in the JSON's workload), or,
with `--no-clip`, refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fsd.cli_options import default_of
from fsd.workload.arrivals import ArrivalProcess

DEFAULT_ARRIVAL = default_of(ArrivalProcess, "kind")  # synthetic arrivals without --arrival
DEFAULT_LENGTHS = "sharegpt"  # synthetic lengths without --lengths
DEFAULT_REQUESTS = 2000  # synthetic requests when --limit is not given
DEFAULT_RATE = default_of(ArrivalProcess, "rate")  # requests per second without --rate


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
    clip: bool = True,
) -> Any:
    """The workload of one `simulate` call, fitted to `max_context` (None: no bound)."""
    from fsd.errors import ConfigError
    from fsd.workload import length_model, make_arrivals, synthetic

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
        workload = read_trace_file(trace, time_scale, limit)
    else:
        if time_scale != 1.0:
            raise ConfigError("--time-scale applies to --trace; a synthetic workload takes --rate")
        process = make_arrivals(
            arrival or DEFAULT_ARRIVAL, DEFAULT_RATE if rate is None else rate, cv
        )
        model = length_model(lengths or DEFAULT_LENGTHS, theta)
        workload = synthetic(process, model, limit or DEFAULT_REQUESTS, seed)
    return fit_context(workload, max_context, clip)


def read_trace_file(path: Path, time_scale: float, limit: int | None) -> Any:
    """A trace by its suffix: `.jsonl` is a Mooncake trace, anything else an Azure CSV."""
    from fsd.workload import read_mooncake, read_trace

    reader = read_mooncake if path.suffix.lower() == ".jsonl" else read_trace
    return reader(path, time_scale=time_scale, limit=limit)


def fit_context(workload: Any, max_context: int | None, clip: bool = True) -> Any:
    """The workload clipped to `max_context`, with a note on stderr of how many requests
    that shortened; with `clip` False, a `ConfigError` instead if any would be."""
    from fsd.errors import ConfigError
    from fsd.sim.cli_report import err

    if max_context is None:
        return workload
    n = int(workload.clip_mask(max_context).sum())
    if n and not clip:
        raise ConfigError(
            f"--no-clip: {n} of {len(workload)} requests of {workload.source} exceed the "
            f"{max_context}-token context (prompt + output); drop --no-clip to clip them, "
            "or set --max-context (0 = no bound)"
        )
    if n:
        err.print(
            f"note: clipped {n} of {len(workload)} requests to the {max_context}-token "
            "context (prompt + output)",
            highlight=False,
        )
    return workload.clipped(max_context)


def load_scenario_workload(
    path: Path,
    time_scale: float,
    length_scale: float,
    limit: int | None,
    given: dict[str, Any],
    max_context: int | None,
    clip: bool = True,
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
    return fit_context(workload, max_context, clip), timeline.actions
