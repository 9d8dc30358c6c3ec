"""The live scene (issue P11): short jobs arrive while a full batch of long jobs decodes.

    .venv/bin/python bench/live_scene.py                       # the default policy
    .venv/bin/python bench/live_scene.py --policy sj-mlfq,fcfs --live-cost both
    .venv/bin/python bench/live_scene.py --set fsd.demote=always --set fsd.threshold=0
    .venv/bin/python bench/live_scene.py --profile-error 100   # profile 100x too fast
    .venv/bin/python bench/live_scene.py --threads 1           # one torch thread

On the real CPU engine with the embedded default model (the tiny preset), in this
process: `--long` jobs (long prompts, `--long-tokens` each, ignore_eos) fill the batch
(max_batch_size = --long); once every one of them decodes, `--short` short jobs
arrive in one burst. Measured on the wall clock: each short job's time to first token
(TTFT) and to its end, and how far the long jobs got meanwhile; and each TTFT in
iterations too (on a shared machine its load sets the seconds, the policy the
iterations). The target: every short job's first token within 2 s.

The engine's cost model is calibrated once (the quick start-up profile) and shared by
every run. `--profile-error F` divides it by F: the profile then predicts iterations
F times faster than they run, as one taken on an idle machine does on a busy one.
`--live-cost on|off|both`: service charged in measured seconds (fsd.cost.calibration)
or in the profile's. `--set KEY=VALUE`: any scheduling or KV setting (fsd.toml names; a policy's own
rule as POLICY.FIELD, e.g. fsd.alpha=50, alphas in SLOs).

Prints a table and writes JSON (default bench/results/live_scene.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

from fsd.config import EngineConfig  # noqa: E402
from fsd.cost import CostModel  # noqa: E402
from fsd.engine.core import Engine  # noqa: E402
from fsd.jobs import Job, SamplingParams  # noqa: E402

TARGET_TTFT_S = 2.0
_COEFFICIENTS = (
    "prefill_base", "prefill_per_token", "prefill_per_token2", "prefill_per_ctx_token",
    "decode_base", "decode_per_seq", "decode_per_ctx_token",
)  # fmt: skip


def setting(text: str) -> tuple[str, Any]:
    """KEY=VALUE with VALUE read as JSON when it parses (numbers, true/false, lists)."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), tuple(value) if isinstance(value, list) else value


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + k * 131) % 250 + 1 for k in range(n)]


def variant(text: str) -> dict[str, Any]:
    """'KEY=VALUE KEY=VALUE': one set of settings to run the scene under besides --set."""
    return dict(setting(part) for part in text.split())


def config(args: argparse.Namespace, policy: str, rules: dict[str, Any]) -> EngineConfig:
    options: dict[str, Any] = {
        "model": args.model,
        "policy": policy,
        "max_batch_size": args.long,
        "num_gpu_blocks": args.gpu_blocks,
        **dict(args.set),
        **rules,
    }
    return EngineConfig.from_kwargs(**options)


def quantiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p90": None, "max": None}
    s = sorted(xs)
    return {"p50": statistics.median(s), "p90": s[min(len(s) - 1, int(0.9 * len(s)))], "max": s[-1]}  # fmt: skip


def run_scene(
    args: argparse.Namespace, cost: CostModel, policy: str, rules: dict[str, Any], live: bool
) -> dict:
    """One run of the scene on a fresh engine; its figures."""
    engine = Engine(config(args, policy, rules), cost=cost)
    engine.measure_cost = live
    try:
        return {"rules": {**dict(args.set), **rules}, **_scene(engine, args, policy, live)}
    finally:
        engine.close()


def _scene(engine: Engine, args: argparse.Namespace, policy: str, live: bool) -> dict:
    long_params = SamplingParams(max_tokens=args.long_tokens, ignore_eos=True)
    longs = [engine.add_request(prompt(i, args.long_prompt), long_params) for i in range(args.long)]
    start = time.time()
    while not all(j.output_token_ids for j in longs):
        engine.step()
    warm_s, warm_iters = time.time() - start, engine.iterations
    long_tokens_before = sum(len(j.output_token_ids) for j in longs)
    short_params = SamplingParams(max_tokens=args.short_tokens, ignore_eos=True)
    burst = time.time()
    shorts = [
        engine.add_request(prompt(1000 + i, args.short_prompt), short_params, arrival_time=burst)
        for i in range(args.short)
    ]
    durations: list[float] = []
    firsts: dict[str, int] = {}  # iterations from the burst to each short job's first token
    while not all(j.status.finished for j in shorts) and time.time() - burst < args.timeout:
        before = engine.iterations
        engine.step()
        if engine.iterations > before and engine.last_iteration is not None:
            durations.append(engine.last_iteration.duration)
        for j in shorts:
            if j.first_token_time is not None and j.job_id not in firsts:
                firsts[j.job_id] = len(durations)
    elapsed = time.time() - burst
    result = _figures(engine, args, longs, shorts, durations, burst, elapsed)
    # the machine's load sets the seconds; the policy sets the iterations
    result["ttft_iterations"] = quantiles([float(n) for n in firsts.values()])
    for job in longs + shorts:  # the scene is over: the rest of the long jobs is not timed
        if not job.status.finished:
            engine.abort(job.job_id)
    return {
        "policy": engine.scheduler.queue.name,
        "asked_policy": policy,
        "live_cost": live,
        "warm_up_s": warm_s,
        "warm_up_iterations": warm_iters,
        "long_tokens_before_burst": long_tokens_before,
        **result,
    }


def _figures(
    engine: Engine,
    args: argparse.Namespace,
    longs: list[Job],
    shorts: list[Job],
    durations: list[float],
    burst: float,
    elapsed: float,
) -> dict:
    ttft = [j.first_token_time - burst for j in shorts if j.first_token_time is not None]
    done = [j.finish_time - burst for j in shorts if j.finish_time is not None]
    live = engine.scheduler.live_cost
    levels: dict[str, int] = {}
    for j in longs:
        key = f"Q{j.level + 1}"
        levels[key] = levels.get(key, 0) + 1
    return {
        "shorts": len(shorts),
        "shorts_started": len(ttft),
        "shorts_finished": len(done),
        "ttft_s": quantiles(ttft),
        "ttft_all_s": sorted(ttft),
        "short_latency_s": quantiles(done),
        "within_target": len(ttft) == len(shorts) and max(ttft) <= TARGET_TTFT_S,
        "burst_s": elapsed,
        "burst_iterations": len(durations),
        "iteration_ms": {
            k: None if v is None else 1e3 * v for k, v in quantiles(durations).items()
        },  # fmt: skip
        "long_tokens_during_burst": sum(sum(1 for t in j.token_times if t >= burst) for j in longs),
        "long_levels_at_end": dict(sorted(levels.items())),
        "long_preemptions": sum(j.preemptions for j in longs),
        "long_swaps_out": sum(j.swaps_out for j in longs),
        "long_recomputes": sum(j.recomputes for j in longs),
        "scale": live.scale,
        "scale_samples": live.samples,
    }


def scaled(cost: CostModel, error: float) -> CostModel:
    """The profile predicting iterations `error` times faster than it measured."""
    if error == 1.0:
        return cost
    changes = {k: getattr(cost, k) / error for k in _COEFFICIENTS}
    return dataclasses.replace(cost, name=f"{cost.name}/{error:g}", **changes)


def print_table(runs: list[dict], console: Console) -> None:
    table = Table(title=f"live scene: short jobs' TTFT behind a full batch (target {TARGET_TTFT_S:g} s)")  # fmt: skip
    for col in ("policy", "rules", "live cost", "started", "TTFT p50", "TTFT max", "TTFT it", "done max",
                "iters", "iter ms p50", "long tok", "long levels", "scale"):  # fmt: skip
        table.add_column(
            col, justify="left" if col in ("policy", "rules", "long levels") else "right"
        )

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}s"

    for r in runs:
        ok = "green" if r["within_target"] else "red"
        table.add_row(
            r["policy"], " ".join(f"{k}={v}" for k, v in r["rules"].items()) or "defaults",
            "on" if r["live_cost"] else "off",
            f"{r['shorts_started']}/{r['shorts']}",
            s(r["ttft_s"]["p50"]), f"[{ok}]{s(r['ttft_s']['max'])}[/]",
            f"{r['ttft_iterations']['max'] or 0:.0f}", s(r["short_latency_s"]["max"]),
            str(r["burst_iterations"]), f"{r['iteration_ms']['p50'] or 0:.0f}",
            str(r["long_tokens_during_burst"]),
            " ".join(f"{k}:{v}" for k, v in r["long_levels_at_end"].items()),
            f"{r['scale']:.3g} ({r['scale_samples']})",
        )  # fmt: skip
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--policy", default="default", help="comma-separated policies to run")
    ap.add_argument("--live-cost", choices=("on", "off", "both"), default="on")
    ap.add_argument("--set", type=setting, action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--variant", type=variant, action="append", default=[], metavar="'K=V K=V'",
        help="also run under these settings (repeatable); the defaults always run",
    )  # fmt: skip
    ap.add_argument("--profile-error", type=float, default=1.0, help="divide the profile by F")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--long", type=int, default=32, help="long jobs (and the max batch size)")
    ap.add_argument("--long-tokens", type=int, default=512)
    ap.add_argument("--long-prompt", type=int, default=200)
    ap.add_argument("--short", type=int, default=25)
    ap.add_argument("--short-tokens", type=int, default=8)
    ap.add_argument("--short-prompt", type=int, default=16)
    ap.add_argument("--gpu-blocks", type=int, default=2048, help="device KV blocks")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds the burst may take")
    ap.add_argument(
        "--threads", type=int, default=None,
        help="torch threads (default: torch's, one per core; on a busy machine each\n"
        "thread waits for the others at every op, and steps get 10x slower)",
    )  # fmt: skip
    ap.add_argument("--json", default="bench/results/live_scene.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=max(Console().width, 150))  # the table's columns, unwrapped

    probe = Engine(config(args, "fcfs", {}))  # the start-up calibration, once for every run
    cost, device = scaled(probe.cost, args.profile_error), probe.device
    probe.close()
    lives = {"on": [True], "off": [False], "both": [True, False]}[args.live_cost]
    runs = []
    for policy in args.policy.split(","):
        for rules in [{}, *args.variant]:
            for live in lives:
                runs.append(run_scene(args, cost, policy.strip(), rules, live))
                r = runs[-1]
                console.print(f"{policy} {rules or ''} live cost {live}: TTFT {r['ttft_s']}")
    print_table(runs, console)
    result = {
        "bench": "live scene (P11)",
        "machine": describe_machine(device),
        "model": args.model,
        "torch_threads": torch.get_num_threads(),
        "target_ttft_s": TARGET_TTFT_S,
        "settings": {k: v for k, v in vars(args).items() if k not in ("json",)}
        | {"set": dict(args.set)},
        "rules": "this tree's sched/KV defaults (fsd.config), changed only by --set/--variant",
        "profile": {k: getattr(cost, k) for k in ("name", *_COEFFICIENTS)},
        "runs": runs,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
