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
    cluster: Any = None,
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
    if cluster is not None and cluster.replicas > 1:
        out.print(
            f"{cluster.replicas} replicas (the pools above each) behind the "
            f"{cluster.router} router",
            highlight=False,
        )


def console() -> Console:
    """Stdout; wide enough for the table when it goes to a file or a pipe."""
    out = Console()
    return out if out.is_terminal else Console(width=160)


def _ms(x: Any) -> str:
    return f"{float(x) * 1e3:.1f}"


def policy_table(title: str, columns: tuple[str, ...]) -> Table:
    """A table of one row per policy: the policy's name left, every figure right."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col == "policy" else "right")
    return table


def _per_request(m: dict[str, Any]) -> str:
    """Preemptions / swaps per finished request (a result that predates them: "-")."""
    if m.get("swaps_per_request") is None:
        return "-"
    return f"{m['preemptions_per_request']:.2f}/{m['swaps_per_request']:.2f}"


def print_table(rows: dict[str, dict[str, Any]], slo: float) -> None:
    table = policy_table(
        f"per-token latency (ms/token), SLO {slo * 1e3:.1f} ms",
        (
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
            "per req",
            "peak KV",
        ),
    )
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
            _per_request(m),
            str(m["peak_kv_blocks"]),
        )
    console().print(table)
    refused = {name: m for name, m in rows.items() if m.get("refused")}
    if refused:  # refuse_wait / refuse_late: the latencies above are the served requests'
        parts = [f"{k} {m['refused']} ({m['refused_frac']:.1%})" for k, m in refused.items()]
        console().print(
            f"refused as overloaded: {', '.join(parts)}; latencies are of the requests "
            "taken, goodput and SLO % count the refused as missed"
        )
    if any(m.get("prefix_hit_rate") for m in rows.values()):
        print_prefix(rows)
    if any(m.get("replicas", 1) > 1 for m in rows.values()):
        print_replicas(rows)


def print_replicas(rows: dict[str, dict[str, Any]]) -> None:
    """How the router spread the load (fsd.sim.replicas)."""
    table = policy_table(
        "replicas: spread of load and prefixes, and the router's time per decision",
        ("policy", "router", "busy CV", "queue max/mean", "split prefix", "resyncs", "us/decision", "p99 us"),
    )
    for name, m in rows.items():
        table.add_row(
            name, str(m["router"]), f"{m['busy_cv']:.3f}", f"{m['queue_max_mean']:.2f}",
            f"{m['split_share']:.1%}", str(m["resyncs"]), f"{m['router_decision_us']:.0f}",
            f"{m['router_decision_p99_us']:.0f}",
        )  # fmt: skip
    console().print(table)


def print_prefix(rows: dict[str, dict[str, Any]]) -> None:
    """The prefix cache's reuse (a workload with prefix hashes: a Mooncake trace)."""
    table = policy_table(
        "prefix cache: prompt tokens reused at first prefill, by tier",
        ("policy", "hit rate", "device", "host", "prefill tok saved", "evicted dev/host"),
    )
    for name, m in rows.items():
        table.add_row(
            name, f"{m['prefix_hit_rate']:.1%}", f"{m['prefix_hit_rate_device']:.1%}",
            f"{m['prefix_hit_rate_host']:.1%}", f"{m['prefill_tokens_saved']:,}",
            f"{m['prefix_evictions']:,}/{m['prefix_host_evictions']:,}",
        )  # fmt: skip
    console().print(table)


def _yes(flag: Any) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def print_sweep(
    rows: dict[str, dict[str, Any]], trace_scale: float | None, slo: float, metric: str = "avg"
) -> None:
    """Each policy's max sustainable rate under the SLO and, when swept, its P95 goodput."""
    table = policy_table(
        f"max sustainable load with {metric} per-token latency <= {slo * 1e3:.1f} ms; "
        "P95 goodput: 95% of jobs within 10 x light-load TTFT and TPOT",
        (
            "policy",
            "max rate r/s",
            "time scale" if trace_scale is not None else "x base rate",
            "P95 goodput r/s",
            "goodput time scale" if trace_scale is not None else "goodput x base",
            "avg ms",
            "p95 ms",
            "runs",
        ),
    )
    mult = trace_scale if trace_scale is not None else 1.0
    for name, r in rows.items():
        has = r["max_scale"] > 0
        g = r.get("goodput95")
        scales = {p["scale"] for p in r["points"]} | {
            p["scale"] for p in (g or {}).get("points", [])
        }
        table.add_row(
            name,
            ("" if r["bracketed"] else ">=") + f"{r['max_rate']:.3f}",
            f"{r['max_scale'] * mult:.3f}",
            ("" if g["bracketed"] else ">=") + f"{g['max_rate']:.3f}" if g else "-",
            f"{g['max_scale'] * mult:.3f}" if g else "-",
            _ms(r["avg"]) if has else "-",
            _ms(r["p95"]) if has else "-",
            str(len(scales)),
        )
    console().print(table)


def print_probes(
    rows: dict[str, dict[str, Any]], trace_scale: float | None, metric: str = "avg"
) -> None:
    """Every probed load of every policy: its latency, attainment, and whether it kept up."""
    table = policy_table(
        "probed loads (sustainable: completed >= 97% of offered, second half)",
        (
            "policy",
            "time scale" if trace_scale is not None else "x base rate",
            "rate r/s",
            f"{metric} ms",
            "TTFT+TPOT met %",
            "done/offered",
            "sustainable",
            "max rate ok",
            "P95 goodput ok",
        ),
    )
    mult = trace_scale if trace_scale is not None else 1.0
    for name, r in rows.items():
        merged: dict[float, dict[str, Any]] = {}
        for p in r["points"]:
            merged[p["scale"]] = {**p, "slo_ok": p["feasible"]}
        for p in r.get("goodput95", {}).get("points", []):
            merged.setdefault(p["scale"], dict(p))["gp_ok"] = p["feasible"]
        for scale in sorted(merged):
            p = merged[scale]
            joint = p.get("joint_attainment")
            table.add_row(
                name,
                f"{scale * mult:.4g}",
                f"{p['rate']:.3f}",
                _ms(p[metric]),
                f"{100 * joint:.1f}" if joint is not None else "-",
                f"{p['throughput_ratio']:.3f}",
                _yes(p["sustainable"]),
                _yes(p.get("slo_ok")),
                _yes(p.get("gp_ok")),
            )
    console().print(table)


def print_light_load(light: dict[str, Any]) -> None:
    """The P95 goodput's reference: FCFS's mean TTFT and TPOT at a light load."""
    at = f"time scale {light['time_scale']:.4g}" if "time_scale" in light else ""
    at = at or f"{light['scale']:.4g} x base rate"
    console().print(
        f"P95 goodput reference: fcfs at {at}: mean TTFT {light['ttft'] * 1e3:.1f} ms, "
        f"TPOT {light['tpot'] * 1e3:.1f} ms; bounds TTFT <= {light['ttft_slo'] * 1e3:.1f} ms, "
        f"TPOT <= {light['tpot_slo'] * 1e3:.1f} ms",
        highlight=False,
    )
