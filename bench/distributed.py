"""Distributed setting in the simulator: OPT-175B on 16 GPUs, TP 8 x PP 2 (paper §6.2).

    .venv/bin/python bench/distributed.py             # ~3 min on 2 cores
    .venv/bin/python bench/distributed.py --quick     # fewer requests
    .venv/bin/python bench/distributed.py --profile opt-175b-a100-40gb-tp8pp2

Setting: the `opt-175b-a100-tp8pp2` analytic profile (16 x A100-80GB, two 8-GPU
nodes; two pipeline stages of 48 layers, each TP 8; derivation in
fsd/cost/profiles/README.md), so up to two micro-batches are in flight; max batch
32 jobs / 4096 tokens per micro-batch, kv policy proactive, SLO 10 x a decode step,
requests clipped to OPT's 2048-token context. The policies: fcfs (vLLM-style
iteration-level FCFS, the paper's FastServe-FCFS), sj-mlfq (fsd's default) and srpt
(the oracle bound), plus fcfs with the pipeline switched off (`fcfs, pp=1`: one
batch at a time on the same 16 GPUs; no policy can pipeline there).

Like the paper's Fig. 11/12 (OPT-175B, 16 GPUs), each workload is run at a few
arrival rates: per-token latency (avg and p95) against rate for each policy. The
workloads are the Azure conversation trace (its own arrivals, time-scaled) and
ShareGPT lengths with Poisson arrivals (the paper's) and bursty Gamma (CV 4) ones.

Writes bench/results/distributed-sim.json and prints markdown tables.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from studies import keep, study_parser, study_result  # noqa: E402

from fsd.config import CacheConfig, SchedConfig  # noqa: E402
from fsd.cost import CostModel  # noqa: E402
from fsd.cost.profiles import load_profile  # noqa: E402
from fsd.sched.slo import default_slo  # noqa: E402
from fsd.sim.capacity import max_context_of, size_pools  # noqa: E402
from fsd.sim.runner import RunSpec, run_many  # noqa: E402
from fsd.workload import Workload, gamma, length_model, poisson, read_trace, synthetic  # noqa: E402

PROFILE = "opt-175b-a100-tp8pp2"
TRACE = Path(__file__).resolve().parents[1] / "scenarios" / "traces" / "azure-llm-2023-conv.csv"
POLICIES = ("fcfs", "sj-mlfq", "srpt")
NO_PIPELINE = "fcfs, pp=1"
KEEP = (
    "avg", "p50", "p95", "p99", "ttft", "tpot", "throughput_rps", "throughput_tps", "goodput",
    "slo_attainment", "preemptions", "swaps", "recomputes", "peak_kv_blocks", "mean_batch",
    "busy_frac", "sim_wall_s",
)  # fmt: skip


@dataclass(frozen=True)
class Family:
    """A workload at several loads: `build(load, n)` makes n requests at that load."""

    name: str
    desc: str
    load_label: str  # what the load numbers are
    loads: tuple[float, ...]
    build: Callable[[float, int], Workload]
    n: int
    quick_n: int


def _trace(scale: float, n: int) -> Workload:
    return read_trace(TRACE, time_scale=scale, limit=n)


def _sharegpt(cv: float) -> Callable[[float, int], Workload]:
    def build(rate: float, n: int) -> Workload:
        arrivals = poisson(rate) if cv == 1.0 else gamma(rate, cv)
        return synthetic(arrivals, length_model("sharegpt"), n, seed=0)

    return build


FAMILIES = (
    Family(
        "conv",
        "Azure LLM conversation trace (2023), time-scaled",
        "time scale",
        (0.2, 0.3, 0.4, 0.5, 0.6),
        _trace,
        1500,
        400,
    ),
    Family(
        "sharegpt",
        "ShareGPT lengths, Poisson arrivals",
        "nominal req/s",
        (1.0, 2.0, 3.0, 4.0, 5.0),
        _sharegpt(1.0),
        1000,
        300,
    ),
    Family(
        "sharegpt-cv4",
        "ShareGPT lengths, Gamma arrivals (CV 4)",
        "nominal req/s",
        (2.0, 3.0, 4.0),
        _sharegpt(4.0),
        1000,
        300,
    ),
)


def specs() -> list[RunSpec]:
    # whole prefills, as the README table was measured
    sched, cache = SchedConfig(prefill_chunk=0), CacheConfig(kv_policy="proactive")
    runs = [RunSpec(p, replace(sched, policy=p), cache) for p in POLICIES]
    return runs + [RunSpec(NO_PIPELINE, replace(sched, policy="fcfs"), cache)]


def run_family(fam: Family, cost: CostModel, ctx: int | None, quick: bool, jobs: int) -> dict:
    """Every load of one workload family: the piped policies, then fcfs unpipelined."""
    flat = replace(cost, pipeline_stages=1)
    *piped, unpiped = specs()
    points = {}
    for load in fam.loads:
        w = fam.build(load, fam.quick_n if quick else fam.n).clipped(ctx)
        t = time.perf_counter()
        rows = run_many(piped, cost, w, jobs)
        rows |= run_many([unpiped], flat, w, 1)
        points[f"{load:g}"] = {
            "load": load,
            "workload": w.summary(),
            "policies": {k: keep(v, KEEP) for k, v in rows.items()},
        }
        took = time.perf_counter() - t
        print(f"  {fam.name} @ {load:g}: {took:.0f} s", file=sys.stderr)
    return {"desc": fam.desc, "load_label": fam.load_label, "points": points}


def markdown(results: dict, slo: float) -> str:
    ms = lambda x: f"{1e3 * x:.0f}"  # noqa: E731
    lines: list[str] = []
    for name, fam in results.items():
        first = next(iter(fam["points"].values()))
        labels = list(first["policies"])
        lines += [
            f"### {name}: {fam['desc']}",
            "",
            f"per-token latency avg / p95 (ms) and throughput (output tokens/s); SLO {ms(slo)} ms",
            "",
            f"| {fam['load_label']} | measured req/s | "
            + " | ".join(labels)
            + " | tok/s (sj-mlfq) |",
            "|---|---|" + "---|" * len(labels) + "---|",
        ]
        for key, pt in fam["points"].items():
            pol = pt["policies"]
            cells = [f"{ms(pol[k]['avg'])} / {ms(pol[k]['p95'])}" for k in labels]
            rate = pt["workload"].get("rate", float("nan"))
            tps = pol["sj-mlfq"]["throughput_tps"]
            lines.append(f"| {key} | {rate:.2f} | " + " | ".join(cells) + f" | {tps:.0f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = study_parser(__doc__, "fewer requests per run")
    ap.add_argument("--profile", default=PROFILE, help="a TP x PP profile (default %(default)s)")
    ap.add_argument("--only", default=",".join(f.name for f in FAMILIES), help="families to run")
    ap.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "distributed-sim.json")
    )
    args = ap.parse_args()
    cost = load_profile(args.profile)
    ctx = max_context_of(cost)
    slo = default_slo(cost)
    t0 = time.perf_counter()
    wanted = args.only.split(",")
    results = {
        f.name: run_family(f, cost, ctx, args.quick, args.jobs)
        for f in FAMILIES
        if f.name in wanted
    }
    text = markdown(results, slo)
    print(text)
    pools = size_pools(cost, CacheConfig())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = study_result(
        "distributed-sim",
        cost,
        args.quick,
        t0,
        gpus=cost.notes.get("gpus"),
        pipeline_stages=cost.pipeline_stages,
        decode_step_s=cost.min_iteration_time,
        stage_time_s=cost.min_iteration_time / cost.pipeline_stages,
        kv_pools_blocks={"device": pools.device, "host": pools.host},
        policies=[*POLICIES, NO_PIPELINE],
        results=results,
        markdown=text,
    )
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
