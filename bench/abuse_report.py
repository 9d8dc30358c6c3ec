"""bench/abuse.py's table (rich, and markdown for docs/results.md) and its check of
the issue's targets: RSS within 200 MB of idle, an honest request within 2 s (5 s under
the fd and frame floods), nothing written through a link, nothing signalled."""

from __future__ import annotations

from typing import Any

from rich.table import Table

RSS_TARGET_MB = 200.0
COLUMNS = ["scenario", "run", "idle MB", "peak Δ MB", "after Δ MB", "fds idle/peak", "stall s",
           "SDK p50/max s", "HTTP p50/max s", "CPU s", "outcome"]  # fmt: skip


def honest_limit(name: str) -> float:
    """The issue's bound on an honest request's latency during scenario `name`."""
    return 5.0 if name.startswith(("fds", "frames")) else 2.0


def _honest(h: dict[str, Any] | None) -> str:
    if not h or h["max_s"] is None:
        return "-"
    failed = f" ({h['failed']}/{h['n']} failed)" if h["failed"] else ""
    return f"{h['p50_s']:.2f}/{h['max_s']:.2f}{failed}"


def cells(name: str, label: str, r: dict[str, Any], cap_mb: float) -> list[str]:
    """One table row of a daemon scenario's figures."""
    peak = f"> {cap_mb:.0f}" if r["capped"] else f"{r['peak_mb'] - r['idle_mb']:+.0f}"
    return [
        name, label, f"{r['idle_mb']:.0f}", peak, f"{r['after_mb'] - r['idle_mb']:+.0f}",
        f"{r['fds_idle']}/{r['fds_peak']}", f"{r['stall_s']}", _honest(r["sdk"]),
        _honest(r.get("http")), f"{r['cpu_s']}", r["outcome"]["line"],
    ]  # fmt: skip


def rows(runs: dict[str, dict[str, Any]], cap_mb: float) -> list[list[str]]:
    """Each scenario's rows, before then after; the state cases last."""
    names = list(dict.fromkeys(n for run in runs.values() for n in run["scenarios"]))
    out = []
    for name in names:
        for label, run in runs.items():
            if name in run["scenarios"]:
                out.append(cells(name, label, run["scenarios"][name], cap_mb))
    states = list(dict.fromkeys(n for run in runs.values() for n in run.get("state", {})))
    for name in states:
        for label, run in runs.items():
            if name in run.get("state", {}):
                out.append([name, label, *[""] * (len(COLUMNS) - 3), run["state"][name]])
    return out


def table(runs: dict[str, dict[str, Any]], cap_mb: float) -> Table:
    commits = ", ".join(f"{k} {v['commit'][:7]}" for k, v in runs.items())
    t = Table(title=f"abuse: the daemon during each reproduction ({commits})")
    for i, col in enumerate(COLUMNS):
        t.add_column(col, justify="left" if i in (0, 1, len(COLUMNS) - 1) else "right")
    for row in rows(runs, cap_mb):
        t.add_row(*row)
    return t


def targets(run: dict[str, Any], cap_mb: float) -> dict[str, str]:
    """Whether each scenario of `run` met the issue's targets ("met", or what missed)."""
    out = {}
    for name, r in run["scenarios"].items():
        missed = []
        grew = r["peak_mb"] - r["idle_mb"]
        if r["capped"] or grew > RSS_TARGET_MB:
            missed.append(
                f"RSS +{grew:.0f} MB" + (f" (> {cap_mb:.0f}: capped)" if r["capped"] else "")
            )
        limit = honest_limit(name)
        for kind in ("sdk", "http"):
            h = r.get(kind)
            if h and (h["failed"] or (h["max_s"] or 0) > limit):
                missed.append(
                    f"{kind} max {h['max_s']} s, {h['failed']}/{h['n']} failed (> {limit:g} s)"
                )
        missed += _p22_missed(name, r)
        out[name] = "met" if not missed else "missed: " + "; ".join(missed)
    for name, line in run.get("state", {}).items():
        bad = "written through" in line or "signalled" in line.replace("nothing signalled", "")
        out[name] = "missed: " + line if bad else "met"
    return out


def _p22_missed(name: str, r: dict[str, Any]) -> list[str]:
    """What a P22 case missed: slots answered in time, subscriptions held and freed."""
    outcome, missed = r["outcome"], []
    if outcome.get("slots_met") is False:
        missed.append("operator or newcomer too slow or refused")
    if name == "sub-flood":
        if r["peak_mb"] - r["idle_mb"] > 3 * 20:
            missed.append(f"peak +{r['peak_mb'] - r['idle_mb']:.0f} MB for 3 connections (20 MB each)")
        if r["after_mb"] - r["idle_mb"] > 20:
            missed.append(f"+{r['after_mb'] - r['idle_mb']:.0f} MB held after they closed")
    if name == "cmd-flood" and (outcome.get("held") or outcome.get("closed") != 50):
        missed.append("commands held or connections left open")
    return missed


def markdown(runs: dict[str, dict[str, Any]], cap_mb: float, command: str) -> list[str]:
    """The table as markdown lines, with the commits and the after run's targets."""
    lines = [", ".join(f"{k}: `{v['commit'][:10]}`" for k, v in runs.items()), ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += [
        "| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows(runs, cap_mb)
    ]
    if "after" in runs:
        lines += ["", "Targets (after):", ""]
        lines += [f"- {k}: {v}" for k, v in targets(runs["after"], cap_mb).items()]
    return lines
