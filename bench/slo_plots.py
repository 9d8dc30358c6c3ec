"""PNG plots of a bench/slo.py report (matplotlib, Agg backend: no display needed).

- `latency`: average and P95 per-token latency against the arrival rate, one line per
  policy, the SLO dashed (paper Figs. 11 and 12);
- `kv`: device KV blocks in use over time at the highest rate, one line per policy
  (paper Fig. 8);
- `split`: each policy's mean latency split into queuing, execution and swapping per
  rate, as shares of the end-to-end latency (paper Fig. 15b).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fsd.console.play_stats import SPLIT

_COLORS = {"queuing": "#d95f02", "execution": "#1b9e77", "swapping": "#7570b3"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(report: dict[str, Any], prefix: Path) -> list[Path]:
    """Write `<prefix>-latency.png`, `-kv.png` and `-split.png`; return their paths."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    return [
        _latency(report, prefix.with_name(prefix.name + "-latency.png")),
        _kv(report, prefix.with_name(prefix.name + "-kv.png")),
        _split(report, prefix.with_name(prefix.name + "-split.png")),
    ]


def _title(report: dict[str, Any]) -> str:
    m = report["machine"]
    where = m.get("gpu") or f"CPU ({m.get('cores')} cores)"
    return f"{report['scenario']}, {report['daemon']['model']} on {where}"


def _latency(report: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    slo = report["slo"]
    for ax, key, label in ((axes[0], "avg", "average"), (axes[1], "p95", "P95")):
        for policy, row in report["policies"].items():
            runs = sorted(row["runs"], key=lambda r: r["rate"])
            ax.plot([r["rate"] for r in runs], [r[key] for r in runs], marker="o", label=policy)
        ax.axhline(slo, color="grey", linestyle="--", label=f"SLO {slo * 1e3:.0f} ms")
        ax.set_xlabel("job arrival rate (jobs/s)")
        ax.set_ylabel(f"{label} latency (s/token)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(_title(report))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _kv(report: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    total = None
    rate = None
    for policy, row in report["policies"].items():
        run = max(row["runs"], key=lambda r: r["rate"])
        rate = run["rate"]
        series = run.get("kv_series") or []
        ax.plot([s["t"] for s in series], [s["device_used"] for s in series], label=policy)
        if series:
            total = series[-1]["device_total"]
    if total:
        ax.axhline(total, color="grey", linestyle="--", label=f"device pool ({total} blocks)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("device KV blocks in use")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"{_title(report)}, {rate:g} jobs/s" if rate is not None else _title(report))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _split(report: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    policies = list(report["policies"])
    fig, axes = plt.subplots(
        1, len(policies), figsize=(4.5 * len(policies), 4), squeeze=False, constrained_layout=True
    )
    for ax, policy in zip(axes[0], policies, strict=True):
        runs = sorted(report["policies"][policy]["runs"], key=lambda r: r["rate"])
        labels = [f"{r['rate']:g}" for r in runs]
        bottom = [0.0] * len(runs)
        for part in SPLIT:
            share = [100 * r.get(f"{part}_frac", 0.0) for r in runs]
            ax.bar(labels, share, bottom=bottom, label=part, color=_COLORS[part])
            bottom = [b + s for b, s in zip(bottom, share, strict=True)]
        ax.set_title(policy)
        ax.set_xlabel("job arrival rate (jobs/s)")
        ax.set_ylabel("share of latency (%)")
        ax.set_ylim(0, 100)
        ax.legend(loc="lower right")
    fig.suptitle(f"latency split: {_title(report)}")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
