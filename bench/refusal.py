"""Overload refusal by predicted first-token wait (`refuse_wait`, off by default), past
capacity: what it refuses, and what the requests it takes see.

    .venv/bin/python bench/refusal.py                  # validation points (~10 min, 2 cores)
    .venv/bin/python bench/refusal.py --conversation   # + the README's example (~15 min)

At every point of the validation set (bench/validation.py: 14 cases x 3 loads, its
quick request count and seeds) the default runs with `refuse_wait` off, 60 s
and 30 s beside the non-oracle policies without refusal. For each run: the share
refused, per-token average and P95, mean and P99 first-token time of the requests
taken, time between tokens P99, goodput and SLO attainment (a refused request counts
as missed), preemptions and swaps per request; the table shows the points where anything was
refused, and a line counts the others (where the bound must change nothing).
`--conversation` adds the Azure conversation trace x0.5 on opt-13b-a100, the default
and FCFS each with and without `refuse_wait` 60 s.
Prints a table, writes bench/results/refusal.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from judge import bar  # noqa: E402
from machine import table_of, write_result  # noqa: E402
from validation import CASES, DEFAULT, PROFILE, VALIDATION_SEED, spec  # noqa: E402

from fsd.config import CacheConfig, SchedConfig  # noqa: E402
from fsd.cost.profiles import load_profile  # noqa: E402
from fsd.sim.capacity import max_context_of  # noqa: E402
from fsd.sim.cli_workload import read_trace_file  # noqa: E402
from fsd.sim.runner import RunSpec, run_many  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "refusal.json"
BOUNDS = (60.0, 30.0)  # refuse_wait values tried, seconds
POLICIES = ("fcfs", "mlfq", "sj-mlfq", "gittins", DEFAULT)
N = 600  # the validation set's quick request count
KEEP = ("refused_frac", "avg", "p95", "ttft", "ttft_p99", "tbt_p99", "goodput",
        "slo_attainment", "preemptions_per_request", "swaps_per_request",
        "sustainable")  # fmt: skip
CONVERSATION = ROOT / "scenarios" / "traces" / "azure-llm-2023-conv.csv"


def refusing(base: RunSpec, wait: float) -> RunSpec:
    return replace(base, label=f"{base.label} wait {wait:g}",
                   sched=replace(base.sched, refuse_wait=wait))  # fmt: skip


def points() -> list[tuple[str, float, int]]:
    """(case, load, its index) at every load of every validation case."""
    return [(c.name, load, i) for i, c in enumerate(CASES) for load in c.loads]


def run_point(name: str, load: float, index: int, jobs: int) -> dict:
    case = CASES[index]
    w = case.build(load, round(N * case.share), VALIDATION_SEED + index)
    plain = [replace(spec(p, p), num_gpu_blocks=case.num_gpu_blocks) for p in POLICIES]
    specs = plain + [refusing(plain[-1], b) for b in BOUNDS]
    rows = run_many(specs, load_profile(PROFILE), w, jobs)
    return {k: {m: r[m] for m in KEEP} for k, r in rows.items()}


def conversation(jobs: int) -> dict:
    """The README's example: Azure conversation x0.5 on opt-13b-a100."""
    cost = load_profile("opt-13b-a100")
    w = read_trace_file(CONVERSATION, 0.5, None).clipped(max_context_of(cost))  # as simulate
    base = [RunSpec(p, SchedConfig(policy=p), CacheConfig()) for p in ("fcfs", DEFAULT)]
    specs = base + [refusing(s, BOUNDS[0]) for s in base]
    rows = run_many(specs, cost, w, jobs)
    return {k: {m: r[m] for m in KEEP} for k, r in rows.items()}


def summary(runs: dict) -> dict:
    """Each refusing run against the best policy without refusal at its point: the
    first-token ratio and the goodput ratio."""
    _, fair = bar({k: r for k, r in runs.items() if "wait" not in k})
    ttft = min(r["ttft"] for r in fair.values())
    good = max(r["goodput"] for r in fair.values())
    return {k: {"ttft_vs_best": r["ttft"] / ttft, "goodput_vs_best": r["goodput"] / good}
            for k, r in runs.items()}  # fmt: skip


def same_as_default(runs: dict) -> bool:
    """Every bounded run of the default equal to the unbounded one, figure by figure."""
    return all(r == runs[DEFAULT] for k, r in runs.items() if k.startswith(f"{DEFAULT} wait"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--conversation", action="store_true", help="add the README's example")
    args = ap.parse_args()
    res: dict[str, dict] = {}
    for name, load, index in points():
        t = time.perf_counter()
        runs = run_point(name, load, index, args.jobs)
        res[f"{name}@{load:g}"] = {"runs": runs, "vs_best": summary(runs)}
        print(f"  {name}@{load:g}: {time.perf_counter() - t:.0f} s", flush=True)
    if args.conversation:
        runs = conversation(args.jobs)
        res["conversation@0.5"] = {"runs": runs, "vs_best": summary(runs)}
    refusing = [p for p, b in res.items() if any(r["refused_frac"] for r in b["runs"].values())]
    rows = [
        {"point": p, "run": k, **r, **res[p]["vs_best"][k]}
        for p in refusing
        for k, r in res[p]["runs"].items()
    ]
    Console().print(table_of(
        "refuse_wait past capacity (ttft: of the requests taken; goodput counts refused as missed)",
        "point | run | refused | avg | P95 | TTFT | TTFT P99 | TBT P99 | goodput | TTFT/best "
        "| goodput/best | preempt/req | swaps/req",
        "{point} | {run} | {refused_frac:.0%} | {avg:.3f} | {p95:.3f} | {ttft:.1f} | "
        "{ttft_p99:.1f} | {tbt_p99:.3f} | {goodput:.3f} | {ttft_vs_best:.2f} | "
        "{goodput_vs_best:.2f} | {preemptions_per_request:.2f} | {swaps_per_request:.2f}",
        rows, left=2,
    ))  # fmt: skip
    same = [p for p in res if p not in refusing and same_as_default(res[p]["runs"])]
    print(f"{len(res) - len(refusing)} points refuse nothing; {len(same)} of them match the "
          "default without a bound in every figure")  # fmt: skip
    settings = {"profile": PROFILE, "requests": N, "seed": VALIDATION_SEED, "bounds": BOUNDS}
    print(write_result(OUT, settings, points=res))


if __name__ == "__main__":
    main()
