"""`fsd profile`: build an engine, profile it with a progress bar, report, save JSON.

The reporting end of the profiler: `fsd.engine.profiler` measures, and
`fsd.cost.fit` fits. This module sits above the engine package (it builds
an `Engine`), so the engine never imports its own command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fsd.cost import CostModel


def comparison_rows(cost: CostModel) -> list[tuple[str, str, float, float, float]]:
    """(phase, shape, fastest s, median s, fitted s) for each measured point in the notes."""
    rows: list[tuple[str, str, float, float, float]] = []
    for p in cost.notes.get("prefill", []):  # type: ignore[union-attr]
        shape = f"{p['tokens']} tokens"
        rows.append(("prefill", shape, p["measured_s"], p["median_s"], p["fitted_s"]))
    for d in cost.notes.get("decode", []):  # type: ignore[union-attr]
        shape = f"b={d['batch']} ctx={d['context']}"
        rows.append(("decode", shape, d["measured_s"], d["median_s"], d["fitted_s"]))
    for c in cost.notes.get("chunk", []):  # type: ignore[union-attr]
        shape = f"{c['tokens']} over {c['cached']} cached"
        rows.append(("chunk", shape, c["measured_s"], c["median_s"], c["fitted_s"]))
    return rows


def chunk_report(cost: CostModel) -> str:
    """How much longer a long prompt takes prefilled in chunks than whole, e.g.
    "x1.07 at chunk 512 (measured x1.05)", from the notes (`fit_cost_model`)."""
    info = cost.notes.get("chunked_prefill")
    if not isinstance(info, dict):
        return ""
    cells = []
    for size, ratio in info.get("slowdown", {}).items():
        cell = f"x{ratio['predicted']:.2f} at chunk {size}"
        if "measured" in ratio:
            cell += f" (measured x{ratio['measured']:.2f})"
        cells.append(cell)
    how = str(info.get("prefill_per_ctx_token", "")).split(":")[0]
    derived = info.get("derived_prefill_per_ctx_token")
    if how == "measured" and isinstance(derived, float):
        how += f" (2 x prefill_per_token2 would be {derived * 1e9:.4f} ns)"
    return (
        f"chunked prefill of {info.get('prompt_tokens')} tokens vs whole, each chunk alone: "
        f"{', '.join(cells)}; prefill_per_ctx_token {how}"
    )


def print_report(cost: CostModel, console: Any) -> None:
    """Every measured point beside its fitted time, then the fitted formulas."""
    from rich.table import Table

    table = Table(title=f"{cost.name}: measured vs fitted ({cost.notes.get('mode')} profile)")
    table.add_column("phase")
    table.add_column("shape", no_wrap=True)
    for col in ("fastest ms", "median ms", "fitted ms", "fit error"):
        table.add_column(col, justify="right")
    for phase, shape, fastest, median, fitted in comparison_rows(cost):
        table.add_row(
            phase,
            shape,
            f"{fastest * 1e3:.3f}",
            f"{median * 1e3:.3f}",
            f"{fitted * 1e3:.3f}",
            f"{(fitted - fastest) / fastest:+.1%}",
        )
    console.print(table)
    console.print(
        f"prefill(n) = {cost.prefill_base * 1e3:.3f} ms + {cost.prefill_per_token * 1e6:.3f} us*n"
        f" + {cost.prefill_per_token2 * 1e9:.4f} ns*n^2\n"
        f"chunk(n, c) = prefill(n) + c * ({cost.decode_per_ctx_token * 1e9:.3f} ns"
        f" + {cost.prefill_per_ctx_token * 1e9:.4f} ns*n)\n"
        f"decode(b, C) = {cost.decode_base * 1e3:.3f} ms + {cost.decode_per_seq * 1e6:.3f} us*b"
        f" + {cost.decode_per_ctx_token * 1e9:.3f} ns*C\n"
        f"q1 (min iteration) = {cost.min_iteration_time * 1e3:.3f} ms; "
        f"swap {cost.swap_bytes_per_s / 1e9:.2f} GB/s; KV {cost.kv_bytes_per_token} B/token"
    )
    if line := chunk_report(cost):
        console.print(line)


def run_profile_command(
    model: str,
    out: Path,
    quick: bool,
    engine_options: dict[str, Any],
    console: Any | None = None,
) -> CostModel:
    """`fsd profile`: build an engine, profile it with a progress bar, print, save JSON."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fsd.config import EngineConfig
    from fsd.engine.core import Engine
    from fsd.engine.profiler import make_plan, profile_engine

    console = console or Console()
    config = EngineConfig.from_kwargs(model=model, **engine_options)
    with console.status(f"loading {model}"):
        # the profile below replaces any calibration, so skip the one at start
        engine = Engine(config, cost=CostModel(name="uncalibrated"))
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("profiling", total=make_plan(engine, quick).num_points)

            def progress(done: int, total: int, label: str) -> None:
                bar.update(task, completed=done, total=total, description=label)

            cost = profile_engine(engine, quick=quick, progress=progress)
    finally:
        engine.close()
    print_report(cost, console)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cost.save(out)
    console.print(f"wrote {out}")
    return cost
