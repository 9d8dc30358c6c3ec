"""What `fsd simulate` prints: the workload header, the latency table, the sweep table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

err = Console(stderr=True)


def print_actions(actions: Any) -> None:
    """A note on stderr for each scenario action the simulator does not apply."""
    for act in actions:
        err.print(
            f"note: {act.kind} at {act.time:g} s {act.changes or ''} is not simulated "
            "(the simulator runs one configuration; fsctl play applies it)",
            highlight=False,
        )


def print_header(
    summary: dict,
    profile: str,
    slo: float,
    pools: Any,
    ctx: Any,
    sched: Any,
    kv: str,
    budget: int,
) -> None:
    out = console()
    out.print(
        f"[bold]{summary['source']}[/]: {summary['requests']} requests, "
        f"{summary.get('rate', float('nan')):.3f} req/s (cv {summary.get('cv', float('nan')):.2f}), "
        f"prompt mean {summary.get('prompt_mean', 0):.0f}, output mean {summary.get('output_mean', 0):.0f}"
        + (f", clipped to {ctx} tokens" if ctx else ""),
        highlight=False,
    )
    out.print(
        f"profile {profile}; SLO {slo * 1e3:.1f} ms/token; KV {pools.device} device + "
        f"{pools.host} host blocks ({pools.source}); kv policy {kv}; max batch tokens "
        f"{sched.max_batch_tokens}; prefill "
        + (f"chunks of {budget} tokens" if budget else "whole")
        + (" (from the SLO)" if budget and sched.prefill_chunk is None else ""),
        highlight=False,
    )


def console() -> Console:
    """Stdout; wide enough for the table when it goes to a file or a pipe."""
    out = Console()
    return out if out.is_terminal else Console(width=160)


def _ms(x: Any) -> str:
    return f"{float(x) * 1e3:.1f}"


def print_table(rows: dict[str, dict[str, Any]], slo: float) -> None:
    table = Table(title=f"per-token latency (ms/token), SLO {slo * 1e3:.1f} ms")
    for col in (
        "policy",
        "avg",
        "p50",
        "p95",
        "p99",
        "ttft s",
        "tpot ms",
        "tbt p99 ms",
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
            _ms(m["tbt_p99"]) if m.get("tbt_p99") is not None else "-",
            f"{m['goodput']:.3f}",
            f"{100 * m['slo_attainment']:.1f}",
            str(m["preemptions"]),
            str(m["swaps"]),
            str(m["peak_kv_blocks"]),
        )
    console().print(table)


def print_sweep(
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
    console().print(table)
