"""A what-if preview as text: current vs proposed, then what the twin assumed.

Shared by `fsctl retune --preview` and the console's retune dialog (no sockets, no
widgets here). Every figure is "mean [lo–hi]" across the seeds' runs; NaN (no run
measured it) shows as "-".
"""

from __future__ import annotations

import math
from typing import Any

from fsd import protocol as P

# (label, PreviewSide field, scale, decimals of the mean and of lo / hi)
ROWS: tuple[tuple[str, str, float, int, int], ...] = (
    ("avg per-token (ms)", "avg", 1e3, 1, 1),
    ("P95 per-token (ms)", "p95", 1e3, 1, 1),
    ("P99 TTFT (s)", "ttft_p99", 1.0, 2, 2),
    ("goodput (/s)", "goodput", 1.0, 2, 2),
    ("finished", "finished", 1.0, 1, 0),
    ("unfinished", "unfinished", 1.0, 1, 0),
    ("preemptions", "preemptions", 1.0, 1, 0),
    ("swaps", "swaps", 1.0, 1, 0),
    ("peak KV blocks", "peak_kv_blocks", 1.0, 1, 0),
)


def num(x: float, decimals: int, whole: bool = False) -> str:
    """`x` with `decimals` places ('180', not '180.0', when `whole`); NaN / inf as "-"."""
    if not math.isfinite(x):
        return "-"
    text = f"{x:.{decimals}f}"
    return text.removesuffix(".0") if whole else text


def spread_text(s: P.Spread, scale: float = 1.0, decimals: int = 1, range_decimals: int = 1) -> str:
    """'mean [lo–hi]', or '-' when no run measured it."""
    if not math.isfinite(s.mean):
        return "-"
    lo, hi = num(s.lo * scale, range_decimals), num(s.hi * scale, range_decimals)
    return f"{num(s.mean * scale, decimals, whole=range_decimals == 0)} [{lo}–{hi}]"


def change_text(current: float, proposed: float) -> str:
    """Proposed vs current in percent ('-23%', '+5%', '0%'); '-' when undefined."""
    if not (math.isfinite(current) and math.isfinite(proposed)):
        return "-"
    if current == 0:
        return "0%" if proposed == 0 else "-"
    pct = (proposed - current) / abs(current) * 100
    return "0%" if round(pct) == 0 else f"{pct:+.0f}%"


def changes_text(changes: dict[str, Any]) -> str:
    """{'policy': 'fcfs', 'quanta': [0.01, 0.02]} → 'policy=fcfs quanta=0.01,0.02'."""

    def value(v: Any) -> str:
        if isinstance(v, list | tuple):
            return ",".join(map(str, v))
        return "none" if v is None else str(v)

    return " ".join(f"{k}={value(v)}" for k, v in changes.items())


def table_lines(reply: P.PreviewReply) -> list[str]:
    """The comparison: one row per figure, columns aligned."""
    rows = [("", "current", "proposed", "change")]
    for label, field, scale, decimals, range_decimals in ROWS:
        cur, new = getattr(reply.current, field), getattr(reply.proposed, field)
        rows.append(
            (
                label,
                spread_text(cur, scale, decimals, range_decimals),
                spread_text(new, scale, decimals, range_decimals),
                change_text(cur.mean, new.mean),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
        for r in rows
    ]


def assumption_lines(a: P.PreviewAssumptions) -> list[str]:
    """What the twin took as given, one fact a line."""
    seeds = ", ".join(map(str, a.seeds[:8])) + (", ..." if len(a.seeds) > 8 else "")
    if a.arrival_rate > 0:
        arrivals = f"arrivals {num(a.arrival_rate, 2)}/s, CV {num(a.arrival_cv, 2)}"
    else:
        arrivals = "arrivals: none assumed"
    window = f"fitted over the last {num(a.arrival_window, 0)} s ({a.arrivals_seen} arrivals)"
    clock = (
        f"clock: iteration = {num(a.clock_scale, 2)} × profile + "
        f"{num(a.clock_overhead * 1e3, 2)} ms (from {a.clock_samples} samples)"
    )
    return [
        "assumed:",
        f"  horizon {num(a.horizon, 1, whole=True)} s, {len(a.seeds)} seeds ({seeds})",
        f"  live jobs {a.live_jobs} (remaining length sampled for {a.sampled_remaining})",
        f"  {arrivals}, {window}",
        f"  lengths resampled from {a.lengths_from} finished jobs",
        f"  {clock}",
        f"  SLO {num(a.slo * 1e3, 1, whole=True)} ms per token (goodput counts the jobs within it)",
        *(f"  note: {note}" for note in a.notes),
    ]


def preview_lines(reply: P.PreviewReply) -> list[str]:
    """The whole preview: what was asked, the comparison, the assumptions."""
    head = f"preview of {changes_text(reply.changes)} (nothing applied"
    head += f"; the twin ran {num(reply.wall_s, 1)} s)" if reply.wall_s else ")"
    return [head, *table_lines(reply), *assumption_lines(reply.assumptions)]
