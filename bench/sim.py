"""Simulator speed: the conversation trace through every policy, the scheduler's
cost per iteration under overload, and the prefix cache's cost on long contexts.

    .venv/bin/python bench/sim.py                   # every section (~30 min on 2 cores)
    .venv/bin/python bench/sim.py --only policies   # 19,366 requests x every policy
    .venv/bin/python bench/sim.py --only cost --mooncake ''   # without the Mooncake rows
    .venv/bin/python bench/sim.py --only prefix     # the prefix cache off and on (~4 min)

policies  data/azure-llm-2023-conv.csv at `--time-scale` (default 0.3 = 1.66 req/s,
          just under FCFS's capacity on opt-13b-a100, where the policies differ but
          nothing is wildly overloaded), clipped to OPT's 2048-token context; kv policy
          proactive, max batch 32, whole prefills. Times the whole run (one process per
          policy, `--jobs` at once) and each policy's own simulation. Goal: <= 30 s for
          the 5 policies of P10 on 2 cores.
cost      fcfs, sj-mlfq and the default policy (if another) on the same trace at x0.3
          and x0.5 (x0.5 is overload: thousands of prompts wait) and on the 1-hour
          Mooncake conversation trace (12,031 long-context requests at its own rate,
          on a 128k-context profile, llama3.1-8b-h100, chunked prefill as configured
          by default; thousands of jobs queue): the CPU microseconds per iteration of the whole simulation and of the scheduler
          alone (`Scheduler.schedule` + `update`: their share of the wall clock, timed
          around each call). One process at a time (`--cost-jobs`): two at once on two
          cores measure each other. Goal (P11): the default's cost per iteration <= 2 x
          FCFS's at conv x0.5. The Mooncake rows take most of the section's ~15 min.
prefix    the first `--prefix-limit` (4,000) requests of the Mooncake conversation trace
          (13k-token prompts on average, 512-token prefix-block hashes; at its own rate, so
          thousands of jobs queue) on llama3.1-8b-h100, the default policy and
          KV policy, with the prefix cache off and on, one run at a time in this
          process, by turns (`--prefix-repeat` 3: each mode's fastest run counts):
          the simulation's wall and CPU seconds, and on / off. The cache's
          cost is per block: every waiting job the batch walk considers is attached
          (its host blocks copied back) and given back if it does not run. Goal (P16):
          on <= 3 x off.

Prints a table per section; writes bench/results/sim-cpu.json (a section run alone
replaces only its own part of the file).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

from fsd.config import CacheConfig, SchedConfig  # noqa: E402
from fsd.cost import CostModel  # noqa: E402
from fsd.cost.profiles import load_profile  # noqa: E402
from fsd.sched.registry import DEFAULT_POLICY, POLICIES  # noqa: E402
from fsd.sched.scheduler import Scheduler  # noqa: E402
from fsd.sim.capacity import max_context_of  # noqa: E402
from fsd.sim.runner import RunSpec, map_tasks, run_many  # noqa: E402
from fsd.workload.spec import Workload  # noqa: E402
from fsd.workload.trace import read_trace  # noqa: E402

_DATA = Path("scenarios") / "traces"
GOAL_S = 30.0
PREFIX_GOAL = 3.0  # the prefix cache on, over off: the simulation's wall seconds
PREFIX_LIMIT = 4000  # requests of the Mooncake trace for the prefix section
COST_GOAL = 2.0  # the default's us/iteration over FCFS's at conv x0.5
COST = {"fcfs": 0.6, "priority": 0.6, "mlfq": 0.8, "sj-mlfq": 1.0, "srpt": 1.0, "gittins": 2.2}
MOONCAKE_PROFILE = "llama3.1-8b-h100"
LONG_CONTEXT = 131_072  # what the Mooncake trace needs (its longest prompt: 126,195)


def data_file(name: str) -> Path:
    """scenarios/traces/<name> in the checkout."""
    return Path(__file__).resolve().parents[1] / _DATA / name


def default_trace() -> Path:
    return data_file("azure-llm-2023-conv.csv")


# ---- the policies section ------------------------------------------------------------


def run_policies(args: argparse.Namespace, console: Console) -> dict[str, Any]:
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
        per_policy[name] = r = {
            "sim_wall_s": m["sim_wall_s"],
            "iterations": m["iterations"],
            "us_per_iteration": 1e6 * m["sim_wall_s"] / max(m["iterations"], 1),
            "avg": m["avg"],
            "p95": m["p95"],
            "peak_jobs": m["peak_jobs"],
        }
        table.add_row(
            name,
            f"{r['sim_wall_s']:.1f}",
            str(r["iterations"]),
            f"{r['us_per_iteration']:.0f}",
            f"{1e3 * m['avg']:.1f}",  # type: ignore[operator]
            f"{1e3 * m['p95']:.1f}",  # type: ignore[operator]
        )
    console.print(table)
    console.print(
        f"total {wall:.1f} s with {args.jobs} process(es) (goal {GOAL_S:.0f} s); trace read {t_read:.2f} s"
    )
    return {
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
    }


# ---- the cost section ------------------------------------------------------------------


@contextmanager
def timed_scheduler() -> Iterator[list[float]]:
    """Seconds spent in Scheduler.schedule and .update while the block runs ([0])."""
    spent = [0.0]
    saved = Scheduler.schedule, Scheduler.update
    clock = time.perf_counter

    def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            t = clock()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += clock() - t

        return call

    Scheduler.schedule, Scheduler.update = timed(saved[0]), timed(saved[1])  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        Scheduler.schedule, Scheduler.update = saved  # type: ignore[method-assign]


CostTask = tuple[str, str, RunSpec, CostModel, Workload]


def cost_run(task: CostTask) -> dict[str, Any]:
    """One run of the cost section (in a worker process): its times per iteration."""
    label, policy, spec, cost, workload = task
    sim = spec.simulator(cost)
    cpu = time.process_time()
    with timed_scheduler() as spent:
        m = sim.run(workload).metrics
    cpu = time.process_time() - cpu
    iters = max(int(m["iterations"]), 1)
    # CPU seconds: other processes on a shared machine stretch the wall clock, not these;
    # the scheduler's share of them is its share of the wall clock
    share = spent[0] / max(float(m["sim_wall_s"]), 1e-9)
    return {
        "workload": label,
        "policy": policy,
        "requests": len(workload),
        "iterations": m["iterations"],
        "sim_wall_s": m["sim_wall_s"],
        "sim_cpu_s": cpu,
        "sched_wall_s": spent[0],
        "us_per_iteration": 1e6 * cpu / iters,
        "sched_us_per_iteration": 1e6 * cpu * share / iters,
        "peak_jobs": m["peak_jobs"],
        "avg": m["avg"],
        "p95": m["p95"],
    }


def mooncake_workload(
    args: argparse.Namespace, limit: int | None = None
) -> tuple[CostModel, Workload] | str:
    """The Mooncake trace (its first `limit` requests; default `--mooncake-limit`) and
    its 128k profile, or why the row is skipped."""
    try:
        from fsd.workload.mooncake import read_mooncake
    except ImportError:
        return "fsd.workload.mooncake.read_mooncake is not there"
    path = Path(args.mooncake)
    if not path.exists():
        return f"{path} does not exist"
    try:
        cost = load_profile(args.mooncake_profile)
    except Exception as exc:  # a missing or unreadable profile: say which
        return f"profile {args.mooncake_profile!r}: {exc}"
    ctx = max_context_of(cost)
    if ctx is None or ctx < LONG_CONTEXT:
        return f"profile {args.mooncake_profile!r} has a {ctx}-token context, not 128k"
    limit = args.mooncake_limit if limit is None else limit
    return cost, read_mooncake(path, 1.0, limit).clipped(ctx)


def cost_tasks(args: argparse.Namespace, console: Console) -> list[CostTask]:
    """(label, policy, spec, cost, workload) for every row, the longest runs first."""
    conv_cost = load_profile(args.profile)
    ctx = max_context_of(conv_cost)
    whole = SchedConfig(prefill_chunk=0)  # as the policies section and bench/policies.py
    tasks: list[CostTask] = []
    for scale in sorted((float(s) for s in args.cost_scales.split(",")), reverse=True):
        conv = read_trace(args.trace, scale, args.limit).clipped(ctx)
        for policy in cost_policies():
            spec = RunSpec(policy, replace(whole, policy=policy), CacheConfig())
            tasks.append((f"conv x{scale:g}", policy, spec, conv_cost, conv))
    moon = mooncake_workload(args) if args.mooncake else "--mooncake ''"
    if isinstance(moon, str):
        console.print(f"[yellow]Mooncake row skipped: {moon}[/yellow]")
    else:
        cost, workload = moon
        span = "1h" if args.mooncake_limit is None else f"{len(workload)} req"
        label = f"mooncake {span} ({args.mooncake_profile})"
        for policy in cost_policies():
            spec = RunSpec(policy, SchedConfig(policy=policy), CacheConfig())
            tasks.insert(0, (label, policy, spec, cost, workload))
    return tasks


def cost_policies() -> list[str]:
    """FCFS, FastServe's skip-join MLFQ, and the default if it is another policy."""
    return ["fcfs", "sj-mlfq"] + ([] if DEFAULT_POLICY in ("fcfs", "sj-mlfq") else [DEFAULT_POLICY])


def run_cost(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    tasks = cost_tasks(args, console)
    t0 = time.perf_counter()
    rows = map_tasks(cost_run, tasks, args.cost_jobs)
    wall = time.perf_counter() - t0
    fcfs = {r["workload"]: r for r in rows if r["policy"] == "fcfs"}
    for r in rows:
        base = fcfs.get(r["workload"])
        r["x_fcfs"] = r["us_per_iteration"] / base["us_per_iteration"] if base else None
    order = cost_policies()
    rows.sort(key=lambda r: (r["workload"], order.index(r["policy"])))
    table = Table(title="scheduler cost per iteration (whole simulation and schedule + update)")
    cols = ("workload", "policy", "requests", "iterations", "sim s", "us/iter", "sched us/iter",
            "x fcfs", "peak jobs")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col in ("workload", "policy") else "right")
    for r in rows:
        name = r["policy"] + (" (default)" if r["policy"] == DEFAULT_POLICY else "")
        table.add_row(
            r["workload"], name, str(r["requests"]), str(r["iterations"]),
            f"{r['sim_wall_s']:.1f}", f"{r['us_per_iteration']:.0f}",
            f"{r['sched_us_per_iteration']:.0f}",
            "" if r["x_fcfs"] is None else f"{r['x_fcfs']:.2f}", str(r["peak_jobs"]),
        )  # fmt: skip
    console.print(table)
    at_05 = {r["policy"]: r["x_fcfs"] for r in rows if r["workload"] == "conv x0.5"}
    goal = at_05.get(DEFAULT_POLICY)
    verdict = ", ".join(f"{p} {x:.2f} x fcfs" for p, x in at_05.items() if p != "fcfs")
    console.print(
        f"conv x0.5: {verdict or 'not run'} (goal: the default, {DEFAULT_POLICY}, <= "
        f"{COST_GOAL:g} x); {wall:.1f} s with {args.cost_jobs} process(es)"
    )
    return {
        "goal_x_fcfs": COST_GOAL,
        "default_policy": DEFAULT_POLICY,
        "default_x_fcfs_conv_0.5": goal,
        "x_fcfs_conv_0.5": at_05,
        "meets_goal": goal is not None and goal <= COST_GOAL,
        "profile": args.profile,
        "mooncake_profile": args.mooncake_profile,
        "processes": args.cost_jobs,
        "total_wall_s": wall,
        "rows": rows,
    }


# ---- the prefix section ------------------------------------------------------------------


def prefix_run(cost: CostModel, workload: Workload, policy: str, on: bool) -> dict[str, Any]:
    """One simulation with the prefix cache on or off: its times and reuse."""
    sim = RunSpec(policy, SchedConfig(policy=policy), CacheConfig(prefix_cache=on)).simulator(cost)
    cpu = time.process_time()
    m = sim.run(workload).metrics
    cpu = time.process_time() - cpu
    return {
        "sim_wall_s": m["sim_wall_s"],
        "sim_cpu_s": cpu,
        "iterations": m["iterations"],
        "us_per_iteration": 1e6 * cpu / max(int(m["iterations"]), 1),
        "prefix_hit_rate": m["prefix_hit_rate"],
        "prefill_tokens_saved": m["prefill_tokens_saved"],
        "prefix_evictions": m["prefix_evictions"],
        "prefix_host_evictions": m["prefix_host_evictions"],
        "peak_jobs": m["peak_jobs"],
        "avg": m["avg"],
        "p95": m["p95"],
        "ttft": m["ttft"],
    }


def run_prefix(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    moon = mooncake_workload(args, args.prefix_limit) if args.mooncake else "--mooncake ''"
    if isinstance(moon, str):
        console.print(f"[yellow]prefix section skipped: {moon}[/yellow]")
        return {"skipped": moon}
    cost, workload = moon
    prompt = sum(r.prompt_len for r in workload) / max(len(workload), 1)
    rows: dict[str, dict[str, Any]] = {}
    for policy in args.prefix_policies.split(","):
        # off and on by turns, `--prefix-repeat` times: each mode's fastest run counts
        # (on a busy machine the others' work only ever adds time)
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(args.prefix_repeat):
            for on in (False, True):
                runs[on].append(prefix_run(cost, workload, policy, on))
        off, on_ = (min(runs[m], key=lambda r: r["sim_wall_s"]) for m in (False, True))
        rows[policy] = {
            "off": off,
            "on": on_,
            "on_over_off": on_["sim_wall_s"] / max(off["sim_wall_s"], 1e-9),
            "on_over_off_cpu": on_["sim_cpu_s"] / max(off["sim_cpu_s"], 1e-9),
            "wall_s_off_runs": [r["sim_wall_s"] for r in runs[False]],
            "wall_s_on_runs": [r["sim_wall_s"] for r in runs[True]],
        }
    title = (
        f"prefix cache cost: {len(workload)} Mooncake requests (mean prompt {prompt:,.0f} "
        f"tokens) on {args.mooncake_profile}"
    )
    table = Table(title=title)
    cols = ("policy", "off s", "on s", "on / off", "cpu on / off", "iterations", "hit rate",
            "evictions", "peak jobs")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for policy, r in rows.items():
        name = policy + (" (default)" if policy in ("default", DEFAULT_POLICY) else "")
        table.add_row(
            name, f"{r['off']['sim_wall_s']:.1f}", f"{r['on']['sim_wall_s']:.1f}",
            f"{r['on_over_off']:.2f}", f"{r['on_over_off_cpu']:.2f}",
            f"{r['off']['iterations']} / {r['on']['iterations']}",
            f"{r['on']['prefix_hit_rate']:.3f}", str(r["on"]["prefix_evictions"]),
            f"{r['off']['peak_jobs']} / {r['on']['peak_jobs']}",
        )  # fmt: skip
    console.print(table)
    worst = max(r["on_over_off"] for r in rows.values())
    console.print(f"on / off: worst {worst:.2f} (goal <= {PREFIX_GOAL:g})")
    return {
        "trace": Path(args.mooncake).name,
        "requests": len(workload),
        "mean_prompt_tokens": prompt,
        "profile": args.mooncake_profile,
        "goal_on_over_off": PREFIX_GOAL,
        "worst_on_over_off": worst,
        "meets_goal": worst <= PREFIX_GOAL,
        "policies": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", default="policies,cost,prefix",
                    help="sections: policies, cost, prefix")  # fmt: skip
    ap.add_argument("--trace", default=str(default_trace()))
    ap.add_argument("--time-scale", type=float, default=0.3)
    ap.add_argument("--limit", type=int, default=None, help="requests of the conv trace")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--profile", default="opt-13b-a100")
    ap.add_argument("--cost-scales", default="0.3,0.5")
    ap.add_argument("--mooncake", default=str(data_file("mooncake-conversation.jsonl")),
                    help="the Mooncake trace ('' to skip its rows)")  # fmt: skip
    ap.add_argument("--mooncake-profile", default=MOONCAKE_PROFILE)
    ap.add_argument("--mooncake-limit", type=int, default=None)
    ap.add_argument("--prefix-limit", type=int, default=PREFIX_LIMIT,
                    help="requests of the Mooncake trace for the prefix section")  # fmt: skip
    ap.add_argument("--prefix-policies", default=DEFAULT_POLICY,
                    help="policies of the prefix section (comma-separated)")  # fmt: skip
    ap.add_argument("--prefix-repeat", type=int, default=3,
                    help="runs of each mode in the prefix section (the fastest counts)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=2, help="processes for the policies section")
    ap.add_argument("--cost-jobs", type=int, default=1, help="processes for the cost section")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sim-cpu.json"))
    args = ap.parse_args()
    sections = set(args.only.split(","))
    unknown = sections - {"policies", "cost", "prefix"}
    if unknown:
        ap.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    console = Console(width=140)
    out = Path(args.out)
    # a section run alone keeps the other's results
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    result.update(bench="sim", machine=describe_machine(torch.device("cpu")))
    if "policies" in sections:
        result.update(run_policies(args, console))
    if "cost" in sections:
        result["cost"] = run_cost(args, console)
    if "prefix" in sections:
        result["prefix"] = run_prefix(args, console)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
