"""Replicas behind a router (P19): every router by name on N = 2 and 4 simulated replicas.

    .venv/bin/python bench/replicas.py --quick     # about 5 minutes on 2 cores
    .venv/bin/python bench/replicas.py             # more requests a point (~20 min)
    .venv/bin/python bench/replicas.py --only validation

Each replica is a whole engine of the profile (its own scheduler, KV pools and
prefix cache), behind one router (fsd.sim.replicas: the daemon's routing code, a
state pushed after every iteration, requests routed since counted optimistically).
The routers: fsd (the default: the least estimated TTFT from each replica's work
queued ahead of the request's skip-join level, its cached prefix by tier and its KV
room; least work when imbalanced), round-robin, least-loaded (vLLM), power-of-two,
cache-aware (SGLang). The default scheduling policy and KV policy on every replica.

The project's rule, tune on one set and judge on another:

tuning     synthetic workloads whose requests share prefixes: on opt-13b-a100
           (2048-token context), `sys`, ShareGPT requests (Poisson) behind 16
           system prompts of 256-1024 tokens (Zipf 1.0 popularity), and `chat`,
           ShareGPT conversations starting in Gamma bursts (CV 4), each turn's prompt
           its conversation so far; on llama3.1-8b-h100, `docs`, ShareGPT questions
           on 256 documents of 2k-16k tokens (Zipf 1.0, Gamma CV 2). Each at two
           loads a replica (near one replica's capacity, past it), N = 2 and 4
           (--quick: N = 4). The fsd router's constants (LOAD_WEIGHT, the imbalance
           thresholds) are chosen here: the candidate whose worst point is least
           behind the best router there; the code ships that one as `fsd`.
validation the shipped traces, never tuned on: the Azure 2023 conversation trace on
           opt-13b-a100 (no prefix hashes: load alone decides) and the Mooncake
           conversation trace on llama3.1-8b-h100 (512-token prefix hashes, 128k
           context), each at a load near one replica's capacity and one past it,
           times N, for N = 2 and 4. Every router runs with its defaults.

Reported per point and router: per-token latency (avg, P95, P99), mean and P99 TTFT,
swaps and preemptions per request, the replicas' load spread (CV of busy time, the
mean of longest over mean queue), prefix hit rate by tier, the share of requests
whose longest earlier-seen prefix went to other replicas only, and the router's
mean and P99 time per decision. The summary is each router's WORST point: its mean
per-token latency over the best router's at that point, with its swaps and
preemptions per request there (and the mean over points beside it).

Writes bench/results/replicas.json (--quick too) and prints markdown tables.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from studies import keep, study_parser, study_result  # noqa: E402

import fsd.router.policies as router_policies  # noqa: E402
from fsd.config import CacheConfig, ClusterConfig, SchedConfig  # noqa: E402
from fsd.cost.profiles import load_profile  # noqa: E402
from fsd.router.registry import ROUTERS  # noqa: E402
from fsd.sim.capacity import max_context_of  # noqa: E402
from fsd.sim.runner import RunSpec, map_tasks, run_one  # noqa: E402
from fsd.workload import Workload, gamma, length_model, poisson, read_trace, synthetic  # noqa: E402
from fsd.workload.mooncake import read_mooncake  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "scenarios" / "traces"
OUT = ROOT / "bench" / "results" / "replicas.json"
HB = 64  # the synthetic workloads' prefix-hash block (tokens)
KEEP = (
    "avg", "p95", "p99", "ttft", "ttft_p99", "preemptions_per_request", "swaps_per_request",
    "throughput_ratio", "busy_cv", "queue_max_mean", "prefix_hit_rate", "prefix_hit_rate_device",
    "prefix_hit_rate_host", "split_share", "same_prefix_requests", "migrations", "resyncs",
    "router_decision_us", "router_decision_p99_us", "sim_wall_s",
)  # fmt: skip


# ---- workloads ------------------------------------------------------------------


def system_prompts(rate: float, n: int, seed: int, groups: int = 16) -> Workload:
    """ShareGPT requests (Poisson) behind `groups` system prompts of 256-1024 tokens,
    Zipf(1.0) popular; each request's own part is unique. Clipped to 2048 tokens."""
    rng = np.random.default_rng(seed + 1)
    base = synthetic(poisson(rate), length_model("sharegpt"), n, seed)
    times, prompts, outputs = base.arrays()
    sizes = rng.integers(256 // HB, 1024 // HB + 1, groups) * HB
    popular = 1.0 / np.arange(1, groups + 1)
    group = rng.choice(groups, n, p=popular / popular.sum())
    outputs = np.minimum(outputs, 2048 - sizes[group] - 1)
    prompts = np.minimum(sizes[group] + prompts, 2048 - outputs)
    hashes = []
    for i in range(n):
        shared = int(sizes[group[i]]) // HB
        own = int(prompts[i]) // HB + 1 - shared
        hashes.append(
            tuple(int(group[i]) * 1000 + j for j in range(shared))
            + tuple(10**7 + i * 100 + j for j in range(max(own, 0)))
        )
    params = {"hash_block": HB, "rate": rate, "lengths": "sharegpt + system prompts"}
    return Workload.from_arrays(times, prompts, outputs, f"sys x{groups}", params, hashes)


def documents(rate: float, n: int, seed: int, docs: int = 256) -> Workload:
    """Questions about long documents (Gamma CV 2 arrivals, 128k-context profile): each
    request is one of `docs` documents of 2k-16k tokens (Zipf 1.0 popular, 512-token
    prefix blocks as in the Mooncake trace) and a ShareGPT message; ShareGPT replies."""
    rng = np.random.default_rng(seed + 2)
    base = synthetic(gamma(rate, 2.0), length_model("sharegpt"), n, seed)
    times, prompts, outputs = base.arrays()
    block = 512
    sizes = rng.integers(2048 // block, 16384 // block + 1, docs) * block
    popular = 1.0 / np.arange(1, docs + 1)
    doc = rng.choice(docs, n, p=popular / popular.sum())
    prompts = sizes[doc] + prompts
    hashes = [
        tuple(int(doc[i]) * 1000 + j for j in range(int(sizes[doc[i]]) // block))
        + tuple(10**7 + i * 100 + j for j in range(int(prompts[i] - sizes[doc[i]]) // block + 1))
        for i in range(n)
    ]
    params = {"hash_block": block, "rate": rate, "lengths": "documents + sharegpt"}
    return Workload.from_arrays(times, prompts, outputs, f"docs x{docs}", params, hashes)


def chats(rate: float, n: int, seed: int, think: float = 20.0) -> Workload:
    """Multi-turn conversations starting in Gamma(CV 4) bursts at `rate` a second,
    2-6 turns, `think` s apart on average; a turn's prompt is its conversation so far
    plus a ShareGPT message, its reply a ShareGPT output (2048 tokens at most)."""
    rng = np.random.default_rng(seed)
    lengths = length_model("sharegpt")
    starts = gamma(rate / 4.0, 4.0).times(n, rng)  # about 4 turns a conversation
    times, prompts, outputs, hashes = [], [], [], []
    for c, start in enumerate(starts):
        user, reply = lengths.sample(6, rng)
        context, t = 0, float(start)
        for k in range(int(rng.integers(2, 7))):
            prompt = context + int(user[k])
            out = int(reply[k])
            if prompt + out > 2048 or len(times) >= n:
                break
            times.append(t)
            prompts.append(prompt)
            outputs.append(out)
            hashes.append(tuple(c * 1000 + j for j in range(prompt // HB + 1)))
            context, t = prompt + out, t + float(rng.exponential(think))
    params = {"hash_block": HB, "rate": rate, "lengths": "sharegpt chats"}
    return Workload.from_arrays(times, prompts, outputs, "chats", params, hashes)


def azure(scale: float, n: int, seed: int) -> Workload:
    return read_trace(TRACES / "azure-llm-2023-conv.csv", time_scale=scale, limit=n)


def mooncake(scale: float, n: int, seed: int) -> Workload:
    return read_mooncake(TRACES / "mooncake-conversation.jsonl", time_scale=scale, limit=n)


@dataclass(frozen=True)
class Family:
    """A workload at per-replica loads: `build(load x N, n, seed)` on `profile`."""

    name: str
    desc: str
    profile: str
    build: Callable[[float, int, int], Workload]
    loads: tuple[float, float]  # per replica: near one replica's capacity, and past it
    n: int
    quick_n: int


TUNING = (
    Family("docs", "questions on 256 documents of 2k-16k tokens, Gamma CV 2 (req/s a replica)",
           "llama3.1-8b-h100", documents, (2.5, 3.0), 1200, 500),
    Family("sys", "ShareGPT behind 16 system prompts, Poisson (req/s a replica)",
           "opt-13b-a100", system_prompts, (2.4, 3.0), 1500, 600),
    Family("chat", "ShareGPT conversations, Gamma CV 4 starts (nominal req/s a replica)",
           "opt-13b-a100", chats, (5.0, 6.5), 1500, 600),
)  # fmt: skip
VALIDATION = (
    Family("azure", "Azure conversation trace (time scale a replica)", "opt-13b-a100",
           azure, (0.4, 0.5), 3000, 1200),
    Family("mooncake", "Mooncake conversation trace (time scale a replica)",
           "llama3.1-8b-h100", mooncake, (0.3, 0.4), 1200, 500),
)  # fmt: skip
REPLICAS = (2, 4)
CODE_LOAD_WEIGHT = router_policies.LOAD_WEIGHT  # the shipped one (a run may change it)


# ---- runs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """A router as run: its name, ClusterConfig changes and the fsd LOAD_WEIGHT."""

    label: str
    router: str
    cluster: tuple[tuple[str, Any], ...] = ()
    load_weight: float | None = None  # None: the code's


def variants(tuning: bool) -> list[Variant]:
    """Every router with its defaults; tuning adds the fsd router's candidates."""
    out = [Variant(r, r) for r in ROUTERS]
    if tuning:
        guard = (("imbalance_s", 2.0), ("imbalance_ratio", 1.5))
        out += [
            Variant("fsd w0", "fsd", load_weight=0.0),
            Variant("fsd w0.5", "fsd", load_weight=0.5),
            Variant("fsd w1", "fsd", load_weight=1.0),
            Variant("fsd guard 2s/1.5", "fsd", guard),
            Variant("fsd no guard", "fsd", (("imbalance_s", 86400.0),)),
        ]
    return out


def _task(args: tuple[str, Variant, int, Family, float, int, bool]) -> tuple[str, str, dict]:
    """One router on one point (in a worker process: LOAD_WEIGHT is set there)."""
    key, v, n, fam, load, seed, quick = args
    router_policies.LOAD_WEIGHT = CODE_LOAD_WEIGHT if v.load_weight is None else v.load_weight
    cost = load_profile(fam.profile)
    w = fam.build(load * n, fam.quick_n if quick else fam.n, seed).clipped(max_context_of(cost))
    cluster = ClusterConfig(replicas=n, router=v.router, **dict(v.cluster))
    spec = RunSpec(v.label, SchedConfig(), CacheConfig(), cluster=cluster)
    row = keep(run_one(spec, cost, w), KEEP)
    row["rate"] = w.rate
    return key, v.label, row


def run_set(
    families: tuple[Family, ...], tuning: bool, quick: bool, jobs: int, replicas: tuple[int, ...]
) -> dict:
    """Every variant at every point of `families`: {point: {"family", ..., "routers"}}."""
    tasks, points = [], {}
    for fam in families:
        for n in replicas:
            for load in fam.loads:
                key = f"{fam.name} N={n} x{load:g}"
                points[key] = {"family": fam.name, "replicas": n, "load": load, "routers": {}}
                tasks += [(key, v, n, fam, load, 0, quick) for v in variants(tuning)]
    # the long runs first: Mooncake's, then the most replicas
    tasks.sort(key=lambda t: (t[3].profile == "opt-13b-a100", -t[2]))
    t0 = time.perf_counter()
    for key, label, row in map_tasks(_task, tasks, jobs):
        points[key]["routers"][label] = row
        points[key]["rate"] = row["rate"]
    print(f"  {len(tasks)} runs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return points


def regrets(points: dict, metric: str = "avg") -> dict[str, dict[str, Any]]:
    """Each router's `metric` over the best router's at each point: the worst point
    (where, by how much, with its swaps and preemptions per request) and the mean."""
    out: dict[str, dict[str, Any]] = {}
    for key, pt in points.items():
        rows = pt["routers"]
        best = min(r[metric] for r in rows.values())
        for label, r in rows.items():
            ratio = r[metric] / best if best > 0 else 1.0
            o = out.setdefault(label, {"ratios": [], "worst": 0.0})
            o["ratios"].append(ratio)
            if ratio >= o["worst"]:
                o.update(worst=ratio, at=key, swaps=r["swaps_per_request"],
                         preemptions=r["preemptions_per_request"], value=r[metric])  # fmt: skip
    for o in out.values():
        o["mean"] = float(np.mean(o.pop("ratios")))
    return out


# ---- report -----------------------------------------------------------------------


def points_markdown(title: str, points: dict) -> list[str]:
    """One table per point: every router's figures."""
    ms = lambda x: f"{1e3 * x:.0f}"  # noqa: E731
    lines = [f"### {title}", ""]
    for key, pt in points.items():
        lines += [
            f"**{key}** ({pt['rate']:.2f} req/s in all)",
            "",
            "| router | avg / p95 / p99 ms | TTFT mean / p99 s | swaps / preempt per req | "
            "busy CV | queue max/mean | hit dev + host | split | decision us mean / p99 |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for label, r in pt["routers"].items():
            lines.append(
                f"| {label} | {ms(r['avg'])} / {ms(r['p95'])} / {ms(r['p99'])} "
                f"| {r['ttft']:.2f} / {r['ttft_p99']:.1f} "
                f"| {r['swaps_per_request']:.2f} / {r['preemptions_per_request']:.2f} "
                f"| {r['busy_cv']:.3f} | {r['queue_max_mean']:.2f} "
                f"| {r['prefix_hit_rate_device']:.1%} + {r['prefix_hit_rate_host']:.1%} "
                f"| {r['split_share']:.1%} "
                f"| {r['router_decision_us']:.0f} / {r['router_decision_p99_us']:.0f} |"
            )
        lines.append("")
    return lines


def worst_markdown(title: str, points: dict) -> list[str]:
    """Each router's worst point (avg and P99 per-token latency over the best router's)."""
    avg, p99 = regrets(points, "avg"), regrets(points, "p99")
    lines = [
        f"### {title}: each router's worst point",
        "",
        "Mean per-token latency over the best router's at the same point (1.00: the best).",
        "",
        "| router | worst avg | at | swaps / preempt per req there | mean avg | worst p99 | at |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in sorted(avg, key=lambda k: avg[k]["worst"]):
        a, b = avg[label], p99[label]
        lines.append(
            f"| {label} | {a['worst']:.2f} | {a['at']} | {a['swaps']:.2f} / "
            f"{a['preemptions']:.2f} | {a['mean']:.2f} | {b['worst']:.2f} | {b['at']} |"
        )
    return lines + [""]


def pick(points: dict) -> str:
    """The fsd candidate whose worst point is least behind (ties: the better mean)."""
    avg = regrets(points, "avg")
    fsd = [k for k in avg if k == "fsd" or k.startswith("fsd ")]
    return min(fsd, key=lambda k: (round(avg[k]["worst"], 3), avg[k]["mean"]))


def main() -> None:
    ap = study_parser(__doc__, "fewer requests a point (a few minutes on 2 cores)")
    ap.add_argument("--only", default="tuning,validation", help="tuning, validation or both")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    t0 = time.perf_counter()
    wanted = args.only.split(",")
    results: dict[str, Any] = {}
    lines: list[str] = []
    if "tuning" in wanted:
        print("tuning set", file=sys.stderr)
        points = run_set(TUNING, True, args.quick, args.jobs, (4,) if args.quick else REPLICAS)
        chosen = pick(points)
        results["tuning"] = {"points": points, "chosen": chosen}
        lines += worst_markdown("tuning (synthetic, shared prefixes)", points)
        lines += [f"Chosen fsd constants: **{chosen}** (the code's default `fsd` is "
                  f"LOAD_WEIGHT {CODE_LOAD_WEIGHT:g}, imbalance {ClusterConfig().imbalance_s:g} s "
                  f"/ x{ClusterConfig().imbalance_ratio:g}).", ""]  # fmt: skip
    if "validation" in wanted:
        print("validation set", file=sys.stderr)
        points = run_set(VALIDATION, False, args.quick, args.jobs, REPLICAS)
        results["validation"] = {"points": points}
        lines += worst_markdown("validation (the shipped traces)", points)
        lines += points_markdown("validation, every point", points)
    text = "\n".join(lines)
    print(text)
    cost = load_profile(VALIDATION[0].profile)
    report = study_result(
        "replicas", cost, args.quick, t0,
        profiles=sorted({f.profile for f in (*TUNING, *VALIDATION)}),
        replicas=list(REPLICAS),
        routers=list(ROUTERS),
        families={f.name: {"desc": f.desc, "profile": f.profile, "loads": list(f.loads),
                           "requests": f.quick_n if args.quick else f.n}
                  for f in (*TUNING, *VALIDATION)},
        results=results,
        markdown=text,
    )  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
