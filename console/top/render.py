"""Rich renderables of a `TopView`: shared by the Textual panels and `fsctl top --once`.

Pure functions of the view (no clocks, no widgets), so a recorded telemetry file
always renders the same text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fsd import protocol as P
from fsd.console.cli_format import (
    SECONDS_KEYS,
    clock,
    duration,
    level_name,
    percent,
    prefill_progress,
    prefix_hit,
)
from fsd.console.top.data import JobRow, TopView

_TICKS = "▁▂▃▄▅▆▇█"
_EIGHTHS = " ▏▎▍▌▋▊▉█"
SLO_BAD = "bold red"
SLO_OK = "green"


def sparkline(values: Sequence[float], width: int) -> str:
    """The last `width` values as block characters scaled to their max (blank if none)."""
    if width <= 0:
        return ""
    tail = list(values)[-width:]
    if not tail:
        return " " * width
    top = max(tail)
    if top <= 0:
        return (_TICKS[0] * len(tail)).rjust(width)
    n = len(_TICKS) - 1
    return "".join(_TICKS[round(v / top * n) if v > 0 else 0] for v in tail).rjust(width)


def bar(fraction: float, width: int) -> str:
    """A horizontal bar with eighth-cell resolution, `width` cells long."""
    cells = max(0.0, min(1.0, fraction)) * width
    full = int(cells)
    part = _EIGHTHS[int((cells - full) * 8)] if full < width else ""
    return ("█" * full + part).ljust(width)[:width]


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GiB"  # unreachable; keeps type checkers calm


def latest(values: Sequence[float]) -> float | None:
    return values[-1] if values else None


def tokens_per_s(view: TopView) -> float:
    """Tokens the engine generates per second now (its recent iterations, not ended jobs)."""
    return latest(view.tokens_per_s) or 0.0


# ---- panels ------------------------------------------------------------------------


def _lines(rows: list[list[tuple[str, str]]]) -> Text:
    """Rows of (text, style) cells as one Text: far cheaper to lay out than a Table."""
    out = Text(no_wrap=True, overflow="ellipsis")
    for i, row in enumerate(rows):
        if i:
            out.append("\n")
        for text, style in row:
            out.append(text, style=style or None)
    return out


NO_SNAPSHOT = Text("no snapshot yet", style="dim")


def levels_panel(view: TopView, bar_width: int = 16) -> RenderableType:
    """One line per MLFQ level: quantum, job count, a bar relative to the fullest level."""
    s = view.snapshot
    if s is None:
        return NO_SNAPSHOT
    most = max((len(lv.job_ids) for lv in s.levels), default=0) or 1
    rows = []
    for lv in s.levels:
        n = len(lv.job_ids)
        quantum = "-" if lv.quantum is None else duration(lv.quantum)
        rows.append([
            (f"{level_name(lv.index):<3}", "bold"), (f"{quantum:>8} ", ""),
            (bar(n / most, bar_width), "cyan"), (f" {n:>5}", ""),
        ])  # fmt: skip
    return _lines(rows)


def kv_panel(view: TopView, spark: int = 16) -> RenderableType:
    """Device used / reserved / free, host used, swap rates with sparklines, and the
    prefix cache's hit rate, cached blocks and evictions (a daemon that reports them)."""
    s = view.snapshot
    if s is None:
        return NO_SNAPSHOT
    kv = s.kv
    frac = kv.device_used / kv.device_total if kv.device_total else 0.0
    host = kv.host_used / kv.host_total if kv.host_total else 0.0
    rows = [
        [
            ("device    ", "bold"),
            (bar(frac, spark), "magenta"),
            (f" {kv.device_used}/{kv.device_total}", ""),
        ],  # fmt: skip
        [("          ", ""), (f"reserved {kv.device_reserved}  free {kv.device_free}", "dim")],
        [
            ("host      ", "bold"),
            (bar(host, spark), "blue"),
            (f" {kv.host_used}/{kv.host_total}", ""),
        ],  # fmt: skip
    ]
    for name, values in (("swap out  ", view.swap_out_rate), ("swap in   ", view.swap_in_rate)):
        rate = latest(values)
        shown = "-" if rate is None else f"{fmt_bytes(rate)}/s"
        rows.append([(name, "bold"), (sparkline(values, spark), "yellow"), (f" {shown}", "")])
    rows.append([("in flight ", "bold"), (fmt_bytes(kv.bytes_in_flight), "")])
    if s.prefix is not None:
        rows.extend(prefix_rows(s.prefix))
    return _lines(rows)


def prefix_rows(p: P.PrefixInfo) -> list[list[tuple[str, str]]]:
    """'prefix    hit 63% (dev 50% host 13%)', then '          cached 12/3  evicted 5/1'
    (blocks, device/host). Rates are of the prompt tokens queried since the daemon
    started; device and host split the hits by the tier they were found in."""
    if not p.enabled:
        return [[("prefix    ", "bold"), ("off", "dim")]]
    device, host = percent(p.hit_rate - p.host_hit_rate), percent(p.host_hit_rate)
    blocks = f"cached {p.device_blocks}/{p.host_blocks}"
    evicted = f"evicted {p.device_evictions}/{p.host_evictions}"
    return [
        [
            ("prefix    ", "bold"),
            (f"hit {prefix_hit(p)}", "green" if p.hits else ""),
            (f" (dev {device} host {host})", ""),
        ],
        [("          ", ""), (f"{blocks}  {evicted}", "dim")],
    ]


def iterations_panel(view: TopView, spark: int = 24) -> RenderableType:
    """Iteration time, batch size and token throughput over the last iterations."""
    s = view.snapshot
    if s is None:
        return NO_SNAPSHOT
    it = latest(view.iter_ms)
    b = latest(view.batch)
    return _lines([
        [("time  ", "bold"), (sparkline(view.iter_ms, spark), "green"), (" -" if it is None else f" {it:.1f}ms", "")],  # fmt: skip
        [("batch ", "bold"), (sparkline(view.batch, spark), "green"), (" -" if b is None else f" {b:.0f}", "")],  # fmt: skip
        [("tok/s ", "bold"), (sparkline(view.tokens_per_s, spark), "green"), (f" {tokens_per_s(view):.1f}", "")],  # fmt: skip
    ])  # fmt: skip


def slo_over(slo: P.SLOInfo) -> bool:
    """Whether the window's per-token latency (average or P95) is over the SLO."""
    limit = slo.slo_per_token_latency
    worst = max((v for v in (slo.avg_per_token_latency, slo.p95_per_token_latency) if v is not None), default=None)  # fmt: skip
    return limit > 0 and worst is not None and worst > limit


def latency_style(value: float | None, limit: float) -> str:
    """Red when over the SLO, green within it, dim when unknown."""
    if value is None:
        return "dim"
    return SLO_BAD if limit > 0 and value > limit else SLO_OK


def slo_panel(view: TopView) -> RenderableType:
    """Per-token latency (avg, P95) against the SLO, TTFT, throughput."""
    s = view.snapshot
    if s is None:
        return NO_SNAPSHOT
    slo = s.slo
    limit = slo.slo_per_token_latency
    avg, p95 = slo.avg_per_token_latency, slo.p95_per_token_latency
    return _lines([
        [("ptl avg ", "bold"), (f"{duration(avg):>8}", latency_style(avg, limit)),
         ("  p95 ", "bold"), (f"{duration(p95):>8}", latency_style(p95, limit))],
        [("ttft avg", "bold"), (f"{duration(slo.avg_ttft):>8}", ""),
         ("  p95 ", "bold"), (f"{duration(slo.p95_ttft):>8}", "")],
        [("tok/s   ", "bold"), (f"{tokens_per_s(view):>8.1f}", ""),
         ("  req/s ", "bold"), (f"{slo.requests_per_s:.2f}", "")],
        [("slo     ", "bold"), (f"{duration(limit):>8}", ""),
         ("  done ", "bold"), (f"{slo.finished} in {slo.window:g}s", "")],
    ])  # fmt: skip


def learned_line(view: TopView) -> Text:
    """What the scheduler learned while serving, on one line: the live cost scale
    (measured / profiled iteration time, the factor service is charged by) and the
    output lengths of finished jobs (quantiles, medians per prompt-length class)."""
    s = view.snapshot
    if s is None:
        return NO_SNAPSHOT
    info = s.sched
    if info is None:
        return Text("live cost and learned lengths: not reported by this daemon", style="dim")
    cells: list[tuple[str, str]] = [("live cost ", "bold")]
    if info.live_cost_samples:
        off = not 0.5 <= info.live_cost <= 2.0  # the profile is far from this machine now
        cells += [(f"×{info.live_cost:.3g}", "bold yellow" if off else SLO_OK),
                  (f" of the profile ({info.live_cost_samples} it)", "dim")]  # fmt: skip
    else:
        cells.append(("×1 (profile, nothing measured yet)", "dim"))
    cells.append(("   learned ", "bold"))
    cells += _learned_cells(info.learned)
    return _lines([cells])


def _learned_cells(learned: P.LearnedInfo | None) -> list[tuple[str, str]]:
    if learned is None:
        return [("- (this policy learns no lengths)", "dim")]
    if not learned.samples:
        return [("nothing finished yet", "dim")]
    warming = "" if learned.ready else " (warming up)"
    cells = [(f"{learned.samples} jobs{warming}", "")]
    for q, tokens in learned.quantiles:
        if q >= 0.5:  # the median and the tail: what decides who keeps a level
            cells.append((f"  p{q * 100:g} ", "bold"))
            cells.append((str(tokens), ""))
    if learned.by_prompt:
        cells.append(("  by prompt", "bold"))
        cells += [(f" ≤{upto}:{median}", "") for upto, _, median in learned.by_prompt]
    return cells


def config_panel(view: TopView) -> RenderableType:
    """The live scheduling and KV settings (sections of the daemon's config)."""
    s = view.snapshot
    if s is None:
        return NO_SNAPSHOT
    rows = []
    sections = [(name, s.config.get(name)) for name in ("effective", "sched", "cache")]
    sections = [(name, values) for name, values in sections if isinstance(values, dict)]
    width = max((len(str(key)) for _, values in sections for key in values), default=0) + 1
    for section, values in sections:
        rows.append([(f"[{section}]", "cyan")])
        for key, value in values.items():
            rows.append([(f" {key:<{width}}", "bold"), (_config_value(value, key in SECONDS_KEYS), "")])  # fmt: skip
    out = _lines(rows)
    out.no_wrap = False  # long quanta lists fold
    return out


def _config_value(value: Any, seconds: bool = False) -> str:
    if isinstance(value, list | tuple) and value and all(_is_pair(v) for v in value):
        return " ".join(f"{name}={_config_value(v)}" for name, v in value)  # policy_settings
    if isinstance(value, list | tuple):
        return ",".join(_config_value(v, seconds) for v in value)
    if isinstance(value, float):
        return duration(value) if seconds else f"{value:.4g}"
    return "-" if value is None else str(value)


def _is_pair(value: Any) -> bool:
    return isinstance(value, list | tuple) and len(value) == 2 and isinstance(value[0], str)


# ---- the job table -----------------------------------------------------------------


class Column(NamedTuple):
    """A job-table column: its header, width, alignment and the sort key it stands for."""

    title: str
    width: int
    right: bool
    sort: str


COLUMNS = (
    Column("JOB", 12, False, "id"),
    Column("LVL", 3, True, "level"),
    Column("RANK", 5, True, "rank"),
    Column("STATE", 9, False, "state"),
    Column("KV", 12, False, "kv"),
    Column("ENST", 8, True, "enst"),
    Column("OUT/IN", 10, True, "tokens"),
    Column("WAITED", 8, True, "waited"),
    Column("ATTAINED", 8, True, "attained"),
    Column("PREFILL", 11, True, "prefill"),  # last: an 80-column screen crops it
)
INJECTED_MARK = "◆"

_STATE_STYLE = {"running": "bold green", "preempted": "yellow", "waiting": "", "new": "dim"}
_KV_STYLE = {"device": "magenta", "host": "blue", "swapping-out": "yellow", "swapping-in": "yellow"}


def job_cells(r: JobRow) -> list[tuple[str, str]]:
    """(text, style) per column of `COLUMNS` for one row."""
    mark = INJECTED_MARK if r.injected else " "
    tokens = f"{r.output_tokens}/{r.prompt_tokens}" if r.in_table else "-"
    return [
        (f"{mark}{r.job_id}", "bold cyan" if r.injected else ""),
        (level_name(r.level), ""),
        ("-" if r.rank is None else str(r.rank), ""),
        (r.state, _STATE_STYLE.get(r.state, "")),
        (r.kv, _KV_STYLE.get(r.kv, "")),
        (duration(r.enst) if r.in_table else "-", ""),
        (tokens, ""),
        (duration(r.waited) if r.in_table else "-", ""),
        (duration(r.attained) if r.in_table else "-", ""),
        (prefill_progress(r.prefilled, r.prompt_tokens), "yellow"),
    ]


def jobs_caption(view: TopView, shown: int, sort: str, reverse: bool) -> str:
    age = view.table_age
    stale = f", table {age:.1f}s old" if age else ""
    order = "desc" if reverse else "asc"
    return f"{shown} of {view.live_jobs} jobs, by {sort} {order}{stale}"


def jobs_table(view: TopView, rows: Sequence[JobRow], limit: int) -> Table:
    """The first `limit` of `rows` as a rich table (for `--once`)."""
    table = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    for col in COLUMNS:
        table.add_column(col.title, justify="right" if col.right else "left", no_wrap=True)
    for r in rows[:limit]:
        table.add_row(*(Text(text, style=style) for text, style in job_cells(r)))
    return table


ROLE_HINT = (
    "client role (read-only): retune/inject need the operator token "
    "(run fsctl as the daemon's user, or give --token-file or FSD_TOKEN)"
)


def role_text(role: str) -> Text:
    """The console's role as the title shows it: operator, or client (read-only)."""
    if role == "operator":
        return Text("operator", style="bold green")
    return Text(f"{role} (read-only)", style="yellow")


def header_text(view: TopView, source: str, status: str = "", role: str | None = None) -> Text:
    """'fsd top — tcp://... — operator — sj-mlfq — #123 12:00:01.250 — status'.

    `role`: what the daemon said this console's requests are (None: not asked, or no
    answer yet; a replay has none).
    """
    s = view.snapshot
    parts = [Text("fsd top", style="bold"), Text(source)]
    if role is not None:
        parts.append(role_text(role))
    if s is not None:
        parts.append(Text(s.policy, style="bold cyan"))
        parts.append(Text(f"#{s.seq} {clock(s.time)}"))
        if slo_over(s.slo):
            parts.append(Text("OVER SLO", style="bold white on red"))
    if status:
        parts.append(Text(status, style="yellow"))
    return Text(" — ").join(parts)


def once(view: TopView, rows: Sequence[JobRow], source: str, limit: int, sort: str) -> Group:
    """The whole console as one printable renderable."""
    from rich.columns import Columns
    from rich.panel import Panel

    def panel(title: str, body: RenderableType) -> Panel:
        return Panel(body, title=title, title_align="left", border_style="blue", expand=False)

    top = Columns(
        [
            panel("MLFQ levels", levels_panel(view)),
            panel("KV residency", kv_panel(view)),
            panel("iterations", iterations_panel(view)),
            panel("SLO", slo_panel(view)),
        ]
    )
    caption = jobs_caption(view, min(limit, len(rows)), sort, False)
    return Group(
        header_text(view, source),
        top,
        learned_line(view),
        panel(f"jobs ({caption})", jobs_table(view, rows, limit)),
        panel("config", config_panel(view)),
    )
