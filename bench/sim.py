"""Simulator speed: the whole Azure conversation trace through every policy.

    .venv/bin/python bench/sim.py                  # 19,366 requests x 5 policies, 2 processes
    .venv/bin/python bench/sim.py --time-scale 0.35 --jobs 1

Workload: data/azure-llm-2023-conv.csv at `--time-scale` (default 0.3 = 1.66 req/s,
just under FCFS's capacity on opt-13b-a100, where the policies differ but nothing is
wildly overloaded), clipped to OPT's 2048-token context; kv policy proactive, max
batch 32. Times the whole run (one process per policy, `--jobs` at once) and each
policy's own simulation. Goal: <= 30 s for the 5 policies on 2 cores. Prints a
table; writes bench/results/sim-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

from fsd.config import CacheConfig, SchedConfig  # noqa: E402
from fsd.sched.profiles import load_profile  # noqa: E402
from fsd.sched.registry import POLICIES  # noqa: E402
from fsd.sim.capacity import max_context_of  # noqa: E402
from fsd.sim.runner import RunSpec, run_many  # noqa: E402
from fsd.workload.trace import read_trace  # noqa: E402

_TRACE_NAME = Path("shared") / "data" / "azure-llm-2023-conv.csv"
TRACE = Path(__file__).resolve().parents[2] / _TRACE_NAME  # shared/ beside the checkout
GOAL_S = 30.0
COST = {"fcfs": 0.6, "priority": 0.6, "mlfq": 0.8, "sj-mlfq": 1.0, "default": 1.0, "srpt": 1.0}


def default_trace() -> Path:
    for p in (TRACE, Path(__file__).resolve().parents[1] / _TRACE_NAME):
        if p.exists():
            return p
    return TRACE


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", default=str(default_trace()))
    ap.add_argument("--time-scale", type=float, default=0.3)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--profile", default="opt-13b-a100")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sim-cpu.json"))
    args = ap.parse_args()
    cost = load_profile(args.profile)
    t0 = time.perf_counter()
    workload = read_trace(args.trace, args.time_scale, args.limit).clipped(max_context_of(cost))
    t_read = time.perf_counter() - t0
    names = args.policies.split(",")
    specs = [RunSpec(p, SchedConfig(policy=p, prefill_chunk=0), CacheConfig()) for p in names]
    # relative cost per iteration, measured (bench/results/sim-cpu.json): the runs are
    # packed into the processes by it rather than handed out one at a time
    weights = [COST.get(p, 1.0) for p in names]
    t0 = time.perf_counter()
    rows = run_many(specs, cost, workload, args.jobs, weights=weights)
    wall = time.perf_counter() - t0
    table = Table(title=f"simulator time: {len(workload)} requests at time scale {args.time_scale}")
    for col in ("policy", "sim s", "iterations", "us/iter", "avg ms/tok", "p95 ms/tok"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    per_policy = {}
    for name, m in rows.items():
        per_policy[name] = {
            "sim_wall_s": m["sim_wall_s"],
            "iterations": m["iterations"],
            "us_per_iteration": 1e6 * m["sim_wall_s"] / max(m["iterations"], 1),
            "avg": m["avg"],
            "p95": m["p95"],
            "peak_jobs": m["peak_jobs"],
        }
        r = per_policy[name]
        table.add_row(
            name,
            f"{r['sim_wall_s']:.1f}",
            str(r["iterations"]),
            f"{r['us_per_iteration']:.0f}",
            f"{1e3 * m['avg']:.1f}",
            f"{1e3 * m['p95']:.1f}",
        )
    console = Console(width=120)
    console.print(table)
    console.print(
        f"total {wall:.1f} s with {args.jobs} process(es) (goal {GOAL_S:.0f} s); trace read {t_read:.2f} s"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "bench": "sim",
                "machine": describe_machine(torch.device("cpu")),
                "trace": Path(args.trace).name,
                "requests": len(workload),
                "time_scale": args.time_scale,
                "profile": args.profile,
                "processes": args.jobs,
                "total_wall_s": wall,
                "trace_read_s": t_read,
                "goal_s": GOAL_S,
                "meets_goal": wall <= GOAL_S,
                "policies": per_policy,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
