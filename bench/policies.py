"""Policy evaluation: every scheduling policy on traces and synthetic workloads (item 8).

    .venv/bin/python bench/policies.py              # the whole study, 2 processes (~15 min)
    .venv/bin/python bench/policies.py --quick      # smaller slices, fewer sections
    .venv/bin/python bench/policies.py --only main,kv --jobs 2
    .venv/bin/python bench/policies.py --chunks [--quick]   # chunked prefill alone

Setting: the opt-13b-a100 analytic profile (1 x A100-80GB; 3531 device KV blocks of
16 tokens, host 4x), max batch 32 jobs / 4096 tokens, kv policy proactive, SLO 10 x
a decode step (171 ms/token), requests clipped to OPT's 2048-token context. Metrics
are per-token latency (end-to-end / output tokens) in ms: avg and p95.

Sections:
  main    every policy (fsd the default), sj-mlfq without admission control (the
          paper's), fsd with fsd.demote = "always", and srpt on the Azure conversation
          trace at several time scales and on synthetic ShareGPT / Alpaca / prefill-heavy workloads, Poisson and bursty
          Gamma arrivals (CV 4, 8, 16), ShareGPT with outputs capped at 20, and
          scenarios/gamma-bursts.toml (a capped burst that starts the run);
  kv      sj-mlfq with each KV policy (defer, recompute, reactive, proactive) on a
          bursty case;
  tuning  fsd's rule changes one at a time (promotion target, alpha, the waiting
          alpha, the preemption threshold, prefill charge, admission) and other
          settings (q1, ratio, levels, K, K') on the workloads where the paper's
          rules struggle;
  seeds   fsd's default against FCFS on 5 draws (seeds) of each synthetic workload;
  sweep   each policy's highest sustainable time scale of the conversation trace under
          the SLO, and its P95 goodput (fsd.sim.sweep);
  validation  (--only validation; bench/validation.py) the held-out set: thirteen workloads of
          shapes not in the tuning set on llama3.1-8b-h100 at three loads each, the share
          of SRPT's gain each policy captures, P95 and P99 TTFT against FCFS, and the
          default with each of its rules switched off (written to policies-validation.json);
  chunks  (--chunks, not in the default list) chunked prefill on opt-13b-h100: fcfs and
          the default with prefill_chunk off, unset (slo: the most prompt tokens whose
          prefill fits the SLO, fsd's default), 256, 512 and 1024 on the conversation
          trace (x0.3, x0.4, x0.5, and x0.8, x1.0: the H100's heavy loads), long prompts (2k-4k tokens, outputs 13-50) among
          ShareGPT chat, long prompts alone, and a burst of 8 prompts of 4000 tokens
          among 16 decoding jobs: the P99 time between tokens (TBT) of the running
          jobs during the burst against one decode step of theirs alone.

Writes bench/results/policies.json (--chunks: policies-chunks.json) and prints
markdown tables.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from studies import keep, study_parser, study_result  # noqa: E402
from validation import run_validation, validation_markdown  # noqa: E402

from fsd.config import CacheConfig, SchedConfig  # noqa: E402
from fsd.cost.profiles import load_profile  # noqa: E402
from fsd.sched.chunking import prefill_budget  # noqa: E402
from fsd.sched.registry import DEFAULT_POLICY, POLICIES  # noqa: E402
from fsd.sched.rules import MAX_ALPHA_SLOS, PaperRules  # noqa: E402
from fsd.sched.slo import default_slo  # noqa: E402
from fsd.sim.capacity import max_context_of  # noqa: E402
from fsd.sim.runner import RunSpec, map_tasks, run_many  # noqa: E402
from fsd.sim.sweep import sweep_all  # noqa: E402
from fsd.workload import (  # noqa: E402
    Request,
    Workload,
    gamma,
    length_model,
    poisson,
    read_trace,
    synthetic,
)
from fsd.workload.scenario import load_scenario  # noqa: E402
from fsd.workload.timeline import expand  # noqa: E402

PROFILE = "opt-13b-a100"
TRACE = Path(__file__).resolve().parents[1] / "scenarios" / "traces" / "azure-llm-2023-conv.csv"
KEEP = (
    "avg",
    "p50",
    "p95",
    "p99",
    "ttft",
    "ttft_p95",
    "tpot",
    "goodput",
    "slo_attainment",
    "preemptions",
    "swaps",
    "recomputes",
    "promotions",
    "peak_kv_blocks",
    "peak_host_blocks",
    "peak_jobs",
    "mean_batch",
    "sync_swap_s",
    "sim_wall_s",
)


@dataclass(frozen=True)
class Case:
    """A named workload and how to build it: build(n requests, seed)."""

    name: str
    desc: str
    build: Callable[[int, int], Workload]
    n: int
    quick_n: int

    @property
    def seeded(self) -> bool:
        """Whether the seed draws a different workload (a trace or a scenario file is
        the same whatever the seed)."""
        return isinstance(self.build, _Synthetic)


def _trace(scale: float) -> Callable[[int, int], Workload]:
    return lambda n, seed: read_trace(TRACE, time_scale=scale, limit=n)


@dataclass(frozen=True)
class _Synthetic:
    """Synthetic arrivals and lengths, one draw per seed."""

    lengths: str
    rate: float
    cv: float = 1.0
    max_output: int | None = None

    def __call__(self, n: int, seed: int) -> Workload:
        arrivals = poisson(self.rate) if self.cv == 1.0 else gamma(self.rate, self.cv)
        return synthetic(arrivals, length_model(self.lengths), n, seed).clipped(
            None, self.max_output
        )


def _scenario(name: str) -> Callable[[int, int], Workload]:
    path = Path(__file__).resolve().parents[1] / "scenarios" / f"{name}.toml"
    return lambda n, seed: expand(load_scenario(path)).workload().head(n)


CASES = [
    Case("conv-0.3", "Azure conv trace x0.3 (1.66 req/s)", _trace(0.3), 4000, 1500),
    Case("conv-0.4", "Azure conv trace x0.4 (2.2 req/s)", _trace(0.4), 3000, 1200),
    Case("conv-0.5", "Azure conv trace x0.5 (2.8 req/s, overload)", _trace(0.5), 3000, 1000),
    Case(
        "sharegpt",
        "ShareGPT lengths, Poisson 3 req/s",
        _Synthetic("sharegpt", 3.0),
        2000,
        800,
    ),
    Case(
        "sharegpt-cv4",
        "ShareGPT, Gamma 2 req/s CV 4",
        _Synthetic("sharegpt", 2.0, 4.0),
        2000,
        800,
    ),
    Case(
        "sharegpt-cv8",
        "ShareGPT, Gamma 2 req/s CV 8",
        _Synthetic("sharegpt", 2.0, 8.0),
        2000,
        800,
    ),
    Case(
        "sharegpt-cv16",
        "ShareGPT, Gamma 2 req/s CV 16",
        _Synthetic("sharegpt", 2.0, 16.0),
        2000,
        800,
    ),
    Case("alpaca", "Alpaca lengths, Poisson 25 req/s", _Synthetic("alpaca", 25.0), 3000, 1200),
    Case(
        "sharegpt-cap20",
        "ShareGPT, outputs capped at 20 tokens, Gamma 30 req/s CV 4",
        _Synthetic("sharegpt", 30.0, 4.0, max_output=20),
        3000,
        1200,
    ),
    Case(
        "prefill-heavy",
        "prompts ~1.5k / outputs ~16, Poisson 2.5 req/s",
        _Synthetic("prefill-heavy", 2.5),
        2000,
        800,
    ),
    Case(
        "prefill-cv8",
        "prompts ~1.5k / outputs ~16, Gamma 1 req/s CV 8",
        _Synthetic("prefill-heavy", 1.0, 8.0),
        2000,
        800,
    ),
    Case(
        "gamma-bursts",
        "scenarios/gamma-bursts.toml: 5 s of Gamma 64 req/s CV 4, outputs <= 20, from cold",
        _scenario("gamma-bursts"),
        1000,
        1000,
    ),
]

KV_CASE = "sharegpt-cv8"
TUNING_CASES = (
    "conv-0.4",
    "conv-0.5",
    "sharegpt-cv8",
    "alpaca",
    "sharegpt-cap20",
    "prefill-cv8",
    "gamma-bursts",
)


# the paper runs no admission control (sj-mlfq's rules are the paper's own already)
NO_ADMISSION = {"admit_fraction": 1.0}


def paper_rules(policy: str = DEFAULT_POLICY) -> dict:
    """The paper's rules (sj-mlfq's own settings, fsd.sched.rules.PaperRules) as
    `policy`'s settings, and no admission control: alpha = the SLO, starved jobs to
    Q1, prefill charged as service, always demote at a quantum's end, any higher job
    preempts, no swap gate."""
    paper = PaperRules()
    own = {f"{policy}.{f.name}": getattr(paper, f.name) for f in fields(paper)}
    return {**own, **NO_ADMISSION}


def tuning_variants(step: float) -> dict[str, dict]:
    """fsd's rule changes one at a time (its own settings, alphas in SLOs), then
    settings reachable by configuration; each a `base_spec` keyword set for fsd."""
    return {
        "fsd default": {},
        "paper rules": paper_rules(),
        "promote to Q1 (top)": {"fsd.promote": "top"},
        "a=SLO": {"fsd.alpha": 1.0, "fsd.waiting_alpha": 1.0},
        "a=10xSLO": {"fsd.alpha": 10.0, "fsd.waiting_alpha": 10.0},
        "waiting a=100xSLO": {"fsd.waiting_alpha": 100.0},
        "waiting a=15xSLO": {"fsd.waiting_alpha": 15.0},
        "no preemption threshold": {"fsd.threshold": 0},
        "preemption threshold 1": {"fsd.threshold": 1},
        "prefill charged": {"fsd.charge_prefill": True},
        "always demote": {"fsd.demote": "always"},
        "no swap gate": {"fsd.swap_gate": False},
        "no admission control": NO_ADMISSION,
        "promote=entry": {"fsd.promote": "entry"},
        "no promotion": {"fsd.alpha": MAX_ALPHA_SLOS, "fsd.waiting_alpha": MAX_ALPHA_SLOS},
        "q1=4 steps": {"q1": 4 * step},
        "ratio=4": {"quantum_ratio": 4.0},
        "levels=12": {"num_levels": 12},
        "K=1, K'=1": {"reserve_min_jobs": 1, "reserve_top_levels": 1},
    }


@dataclass
class Study:
    """Everything one invocation measured, ready for JSON."""

    quick: bool
    jobs: int
    results: dict = field(default_factory=dict)


def base_spec(label: str, policy: str, kv: str = "proactive", **opts) -> RunSpec:
    """`opts`: SchedConfig and CacheConfig fields by name, and policies' own settings
    as POLICY.FIELD (`**{"fsd.demote": "always"}`)."""
    # The policy study (README, "Scheduling results") runs whole prefills, as it did
    # before chunked prefill; the chunks section sets prefill_chunk itself.
    opts.setdefault("prefill_chunk", 0)
    cache_keys = {"reserve_min_jobs", "reserve_top_levels", "admit_fraction"}
    own = {k: v for k, v in opts.items() if "." in k}
    plain = {k: v for k, v in opts.items() if k not in own and k not in cache_keys}
    sched = SchedConfig(policy=policy, policy_settings=own, **plain)
    cache = CacheConfig(kv_policy=kv, **{k: v for k, v in opts.items() if k in cache_keys})
    return RunSpec(label, sched, cache)


def load(case: Case, quick: bool, ctx: int | None, seed: int = 0) -> Workload:
    return case.build(case.quick_n if quick else case.n, seed).clipped(ctx)


def run_main(study: Study, cost, ctx) -> None:
    specs = [base_spec(p, p) for p in POLICIES]
    # the paper's own rules beside fsd's default, to show what the rule changes buy
    specs.insert(4, base_spec("sj-mlfq (paper)", "sj-mlfq", **NO_ADMISSION))
    # fsd's default minus the Gittins demotion rule (always demote at a quantum's end)
    specs.insert(5, base_spec("fsd (always demote)", DEFAULT_POLICY, **{"fsd.demote": "always"}))
    out = {}
    for case in CASES:
        w = load(case, study.quick, ctx)
        t = time.perf_counter()
        rows = run_many(specs, cost, w, study.jobs)
        out[case.name] = {
            "desc": case.desc,
            "workload": w.summary(),
            "policies": {k: keep(v, KEEP) for k, v in rows.items()},
        }
        print(f"  main {case.name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    study.results["main"] = out


def run_kv(study: Study, cost, ctx) -> None:
    case = next(c for c in CASES if c.name == KV_CASE)
    w = load(case, study.quick, ctx)
    specs = [
        base_spec(f"sj-mlfq/{kv}", "sj-mlfq", kv)
        for kv in ("defer", "recompute", "reactive", "proactive")
    ]
    specs.append(base_spec("fcfs/proactive", "fcfs"))
    rows = run_many(specs, cost, w, study.jobs)
    study.results["kv"] = {
        "case": KV_CASE,
        "desc": case.desc,
        "runs": {k: keep(v, KEEP) for k, v in rows.items()},
    }


def run_tuning(study: Study, cost, ctx) -> None:
    step = cost.min_iteration_time
    out = {}
    for name in TUNING_CASES:
        case = next(c for c in CASES if c.name == name)
        w = load(case, study.quick, ctx)
        specs = [
            base_spec(label, DEFAULT_POLICY, **opts)
            for label, opts in tuning_variants(step).items()
        ]
        specs.append(base_spec("fcfs", "fcfs"))
        specs.append(base_spec("srpt", "srpt"))
        t = time.perf_counter()
        rows = run_many(specs, cost, w, study.jobs)
        out[name] = {k: keep(v, KEEP) for k, v in rows.items()}
        print(f"  tuning {name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    study.results["tuning"] = out


SEEDS = 5  # seed 0 draws the main table's workloads


def run_seeds(study: Study, cost, ctx) -> None:
    """fsd's default against FCFS on fresh draws of every synthetic workload.

    Why: one draw's P95 is one burst's outcome; the main table's verdicts (wins by a
    fraction of a percent) mean something only if other draws agree.
    """
    specs = [base_spec("fcfs", "fcfs"), base_spec("default", "default")]
    out = {}
    for case in CASES:
        if not case.seeded:
            continue
        t = time.perf_counter()
        draws = []
        for seed in range(3 if study.quick else SEEDS):
            rows = run_many(specs, cost, load(case, study.quick, ctx, seed), study.jobs)
            draws.append({"seed": seed, **{k: keep(v, KEEP) for k, v in rows.items()}})
        out[case.name] = draws
        print(f"  seeds {case.name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    study.results["seeds"] = out


def seeds_markdown(seeds: dict) -> list[str]:
    """Per workload: on how many draws the default is no worse than FCFS, the worst
    draw's ratio to FCFS and the means over the draws."""
    draws_per = len(next(iter(seeds.values()), []))
    lines = [
        f"### fsd's default against fcfs over {draws_per} draws of each synthetic workload",
        "",
        "| workload | avg <= fcfs | p95 <= fcfs | worst avg ratio | worst p95 ratio "
        "| mean avg ms fcfs / default | mean p95 ms fcfs / default |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, draws in seeds.items():
        n = len(draws)
        cells = [name]
        for metric in ("avg", "p95"):
            wins = sum(d["default"][metric] <= d["fcfs"][metric] for d in draws)
            cells.append(f"{wins}/{n}")
        for metric in ("avg", "p95"):
            worst = max(draws, key=lambda d, m=metric: d["default"][m] / d["fcfs"][m])
            ratio = worst["default"][metric] / worst["fcfs"][metric]
            cells.append(f"{ratio:.3f} (seed {worst['seed']})")
        for metric in ("avg", "p95"):
            f = sum(d["fcfs"][metric] for d in draws) / n
            d = sum(d["default"][metric] for d in draws) / n
            cells.append(f"{1e3 * f:.1f} / {1e3 * d:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def run_sweep(study: Study, cost, ctx) -> None:
    """Each policy's highest sustainable load under the SLO and its P95 goodput
    (fsd.sim.sweep: a rate counts only if the run keeps up with its arrivals)."""
    n = 1000 if study.quick else 3000
    w = read_trace(TRACE, time_scale=0.3, limit=n).clipped(ctx)
    names = ["fcfs", "sj-mlfq", "srpt"] + (["default"] if DEFAULT_POLICY != "sj-mlfq" else [])
    names += ["priority", "mlfq"]
    specs = [base_spec(p, p) for p in names]
    found = sweep_all(specs, cost, w, "avg", 1.0, 0.05, study.jobs)
    rows = {}
    for label, by_target in found.items():
        r, g = by_target["slo"], by_target["goodput95"]
        rows[label] = {
            "max_time_scale": 0.3 * r.max_scale,
            "max_rate": r.max_rate,
            "bracketed": r.bracketed,
            "at_max": keep(r.metrics or {}, KEEP),
            "points": r.points,
            "goodput95_time_scale": 0.3 * g.max_scale,
            "goodput95_rate": g.max_rate,
            "goodput95_bracketed": g.bracketed,
        }
    study.results["sweep"] = {"trace": TRACE.name, "requests": n, "metric": "avg", "runs": rows}


# ---- chunked prefill (P10) -------------------------------------------------------

CHUNK_PROFILE = "opt-13b-h100"
CHUNK_SIZES = (0, None, 256, 512, 1024)  # 0: whole prefills; None: from the SLO (the default)
BURST_CHUNKS = (0, None, 128, 192, 256, 512, 1024)  # the burst is cheap: smaller sizes too
CHUNK_POLICIES = ("fcfs", "default")
CHUNK_KEEP = (
    "avg", "p95", "ttft", "ttft_p99", "tbt_mean", "tbt_p50", "tbt_p99", "tbt_max",
    "preemptions", "iterations", "mean_batch", "makespan_s", "sim_wall_s",
)  # fmt: skip
LONG_PROMPT = 2048  # a job with at least this many prompt tokens is a "long" one


@dataclass(frozen=True)
class _LongAndChat:
    """Long prompts (2048..4000 tokens, outputs 13..50) among ShareGPT chat requests,
    each stream Poisson; the prompts stay under the default 4096-token batch budget
    with a full batch of decodes, so whole prefills can run beside them."""

    long_rate: float
    chat_rate: float

    def __call__(self, n: int, seed: int) -> Workload:
        rng = np.random.default_rng(seed)
        n_long = max(1, round(n * self.long_rate / (self.long_rate + self.chat_rate)))
        n_chat = n - n_long
        chat_p, chat_o = length_model("sharegpt").sample(n_chat, rng)
        arrivals = poisson(self.long_rate).times(n_long, rng)
        if n_chat:
            arrivals = np.concatenate([arrivals, poisson(self.chat_rate).times(n_chat, rng)])
        prompts = np.concatenate([rng.integers(LONG_PROMPT, 4001, n_long), chat_p])
        outputs = np.concatenate([rng.integers(13, 51, n_long), chat_o])
        source = f"long prompts {self.long_rate:g}/s + sharegpt chat {self.chat_rate:g}/s"
        params = {"long_rate": self.long_rate, "chat_rate": self.chat_rate, "seed": seed}
        return Workload.from_arrays(arrivals, prompts, outputs, source, params)


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


CHUNK_CASES = [
    _case("conv-0.3"),
    _case("conv-0.4"),
    _case("conv-0.5"),
    # the H100 serves x0.3-0.5 with room to spare: x0.8 is near the SLO, x1.0 past it
    Case("conv-0.8", "Azure conv trace x0.8 (4.4 req/s)", _trace(0.8), 3000, 1000),
    Case("conv-1.0", "Azure conv trace x1.0 (5.5 req/s, overload)", _trace(1.0), 3000, 1000),
    Case("long+chat-1", "long prompts 1 req/s + chat 3 req/s", _LongAndChat(1.0, 3.0), 2000, 800),
    Case(
        "long+chat-1.5", "long prompts 1.5 req/s + chat 4 req/s", _LongAndChat(1.5, 4.0), 2000, 800
    ),
    Case("long-only", "long prompts alone, Poisson 2 req/s", _LongAndChat(2.0, 0.0), 1000, 400),
]


def chunk_label(policy: str, chunk: int | None) -> str:
    return f"{policy}/{'slo' if chunk is None else chunk or 'off'}"


def _class_split(jobs) -> dict:
    """Per-token latency and TTFT of the long-prompt jobs and of the others."""
    out = {}
    for name, group in (
        ("long", [j for j in jobs if j.prompt_len >= LONG_PROMPT]),
        ("short", [j for j in jobs if j.prompt_len < LONG_PROMPT]),
    ):
        if group:
            out[f"{name}_jobs"] = len(group)
            out[f"{name}_avg"] = float(np.mean([j.per_token_latency for j in group]))
            out[f"{name}_ttft"] = float(np.mean([j.ttft for j in group]))
    return out


def _chunk_task(args: tuple) -> dict:
    spec, cost, w = args
    result = spec.simulator(cost).run(w)
    row = {k: result.metrics[k] for k in CHUNK_KEEP}
    budget = prefill_budget(spec.sched.prefill_chunk, cost, spec.cache.block_size)
    return {"policy": spec.sched.policy, "prefill_chunk": spec.sched.prefill_chunk,
            "prefill_budget": budget, **row,
            **_class_split(result.jobs)}  # fmt: skip


def run_chunks(study: Study, _cost, _ctx) -> None:
    """fcfs and the default with each prefill chunk size, on the H100 profile: the
    conversation trace at three loads, long prompts among chat, and a burst."""
    cost = load_profile(CHUNK_PROFILE)
    ctx = max_context_of(cost)
    specs = [
        base_spec(chunk_label(p, c), p, prefill_chunk=c)
        for p in CHUNK_POLICIES
        for c in CHUNK_SIZES
    ]
    cases = {}
    for case in CHUNK_CASES:
        # the trace is clipped to OPT's context; the synthetic prompts (up to 4k) are not
        w = load(case, study.quick, ctx if case.name.startswith("conv") else None)
        t = time.perf_counter()
        rows = map_tasks(_chunk_task, [(s, cost, w) for s in specs], study.jobs)
        cases[case.name] = {
            "desc": case.desc,
            "workload": w.summary(),
            "runs": {s.label: row for s, row in zip(specs, rows, strict=True)},
        }
        print(f"  chunks {case.name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    study.results["chunks"] = {
        "profile": CHUNK_PROFILE,
        "slo": default_slo(cost),
        "cases": cases,
        "burst": run_burst(cost),
    }


# a steady batch of decodes, then a burst of long prompts all at once
BURST = {"decodes": 16, "decode_prompt": 512, "decode_output": 400, "at_s": 1.0,
         "prompts": 8, "prompt": 4000, "prompt_output": 16}  # fmt: skip


def burst_workload() -> Workload:
    b = BURST
    steady = [
        Request(0.01 * i, b["decode_prompt"], b["decode_output"]) for i in range(b["decodes"])
    ]
    burst = [Request(b["at_s"], b["prompt"], b["prompt_output"])] * b["prompts"]
    return Workload(tuple(steady + burst), "burst", dict(b))


def _token_times(job) -> np.ndarray:
    return job.first_token_time + np.concatenate([[0.0], np.cumsum(np.frombuffer(job.gaps))])


def burst_stats(jobs, cost, at: float) -> dict:
    """The running jobs' gaps from the burst's arrival until its last prompt is
    prefilled, against one decode step of those jobs alone (cost.decode_time)."""
    burst = [j for j in jobs if j.arrival_time >= at]
    end = max(j.first_token_time for j in burst)
    gaps, batch, ctx = [], 0, 0
    for j in (j for j in jobs if j.arrival_time < at):
        times = _token_times(j)
        ends = times[1:]
        gaps.append(np.frombuffer(j.gaps)[(ends > at) & (ends <= end)])
        produced = int((times <= at).sum())
        if 0 < produced < len(times):  # decoding when the burst came
            batch += 1
            ctx += j.prompt_len + produced
    g = np.concatenate(gaps)
    step = cost.decode_time(batch, ctx)
    p99 = float(np.percentile(g, 99)) if g.size else float("nan")
    return {
        "running": batch,
        "decode_step": step,
        "burst_s": end - at,
        "gaps": int(g.size),
        "tbt_p99_running": p99,
        "tbt_max_running": float(g.max()) if g.size else float("nan"),
        "ratio": p99 / step,
        "burst_ttft": float(np.mean([j.ttft for j in burst])),
    }


def run_burst(cost) -> dict:
    w = burst_workload()
    rows = {}
    for policy in CHUNK_POLICIES:
        for chunk in BURST_CHUNKS:
            result = base_spec("burst", policy, prefill_chunk=chunk).simulator(cost).run(w)
            stats = burst_stats(result.jobs, cost, BURST["at_s"])
            rows[chunk_label(policy, chunk)] = {
                "policy": policy, "prefill_chunk": chunk, **stats,
                **{k: result.metrics[k] for k in ("avg", "ttft", "tbt_p99")},
            }  # fmt: skip
    return {"workload": dict(BURST), "runs": rows}


def chunks_markdown(res: dict) -> list[str]:
    ms = lambda x: f"{1e3 * x:.1f}"  # noqa: E731
    lines = [
        f"### Chunked prefill on {res['profile']} (SLO {ms(res['slo'])} ms/token)",
        "",
        "| workload | run | avg ms/token | vs off | ttft s (mean / p99) | tbt ms (mean / p99) "
        "| long jobs: avg ms, ttft s | short jobs: avg ms, ttft s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, block in res["cases"].items():
        runs = block["runs"]
        for label, m in runs.items():
            off = runs[chunk_label(m["policy"], 0)]["avg"]
            split = [
                f"{ms(m[f'{c}_avg'])}, {m[f'{c}_ttft']:.2f}" if f"{c}_avg" in m else "-"
                for c in ("long", "short")
            ]
            lines.append(
                f"| {name} | {label} | {ms(m['avg'])} | {m['avg'] / off:.3f} | "
                f"{m['ttft']:.3f} / {m['ttft_p99']:.3f} | {ms(m['tbt_mean'])} / "
                f"{ms(m['tbt_p99'])} | " + " | ".join(split) + " |"
            )
    b = res["burst"]["workload"]
    lines += [
        "",
        f"### Burst: {b['prompts']} prompts of {b['prompt']} tokens at {b['at_s']} s among "
        f"{b['decodes']} decoding jobs",
        "",
        "| run | running jobs' P99 TBT ms | max ms | decode step ms | P99 / step "
        "| burst prefilled in s | burst ttft s | avg ms/token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, m in res["burst"]["runs"].items():
        lines.append(
            f"| {label} | {ms(m['tbt_p99_running'])} | {ms(m['tbt_max_running'])} | "
            f"{ms(m['decode_step'])} | {m['ratio']:.2f} | {m['burst_s']:.2f} | "
            f"{m['burst_ttft']:.2f} | {ms(m['avg'])} |"
        )
    lines.append("")
    return lines


def markdown(study: Study, slo: float) -> str:
    lines: list[str] = []
    res = study.results
    ms = lambda x: f"{1e3 * x:.1f}"  # noqa: E731
    if "main" in res:
        policies = list(next(iter(res["main"].values()))["policies"])
        lines += [
            "### Per-token latency, avg / p95 (ms), proactive KV",
            "",
            "| workload | " + " | ".join(policies) + " |",
            "|---|" + "---|" * len(policies),
        ]
        for name, block in res["main"].items():
            cells = [f"{ms(m['avg'])} / {ms(m['p95'])}" for m in block["policies"].values()]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    if "kv" in res:
        lines += [
            f"### KV policies on {res['kv']['case']} (avg / p95 ms, swaps, recomputes)",
            "",
            "| run | avg | p95 | swaps | recomputes | sync swap s |",
            "|---|---|---|---|---|---|",
        ]
        for label, m in res["kv"]["runs"].items():
            lines.append(
                f"| {label} | {ms(m['avg'])} | {ms(m['p95'])} | {m['swaps']} | "
                f"{m['recomputes']} | {m['sync_swap_s']:.1f} |"
            )
        lines.append("")
    if "tuning" in res:
        cases = list(res["tuning"])
        labels = list(next(iter(res["tuning"].values())))
        lines += [
            "### sj-mlfq settings (avg / p95 ms)",
            "",
            "| setting | " + " | ".join(cases) + " |",
            "|---|" + "---|" * len(cases),
        ]
        for label in labels:
            cells = [
                f"{ms(res['tuning'][c][label]['avg'])} / {ms(res['tuning'][c][label]['p95'])}"
                for c in cases
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    if "seeds" in res:
        lines += seeds_markdown(res["seeds"])
    if "chunks" in res:
        lines += chunks_markdown(res["chunks"])
    if "validation" in res:
        lines += validation_markdown(res["validation"])
    if "sweep" in res:
        lines += [
            f"### Max conv-trace load with avg per-token latency <= {ms(slo)} ms "
            f"({res['sweep']['requests']} requests)",
            "",
            "| policy | max time scale | max rate (req/s) | x fcfs | P95 goodput (req/s) | x fcfs |",
            "|---|---|---|---|---|---|",
        ]
        runs = res["sweep"]["runs"]
        base = runs["fcfs"]["max_rate"] or float("nan")
        good = runs["fcfs"].get("goodput95_rate") or float("nan")
        for label, r in runs.items():
            bound = "" if r["bracketed"] else ">= "
            gp = r.get("goodput95_rate", float("nan"))
            lines.append(
                f"| {label} | {bound}{r['max_time_scale']:.3f} | {r['max_rate']:.2f} | "
                f"{r['max_rate'] / base:.2f} | {gp:.2f} | {gp / good:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = study_parser(__doc__, "smaller workloads")
    ap.add_argument("--only", default="main,kv,tuning,seeds,sweep", help="sections to run")
    ap.add_argument(
        "--chunks",
        action="store_true",
        help="the chunked-prefill section alone (opt-13b-h100), into policies-chunks.json",
    )
    ap.add_argument("--out", default=None, help="default: results/policies[-chunks].json")
    args = ap.parse_args()
    only = "chunks" if args.chunks else args.only
    cost = load_profile(PROFILE)  # the chunks section loads its own (CHUNK_PROFILE)
    ctx = max_context_of(cost)
    study = Study(args.quick, args.jobs)
    sections = {
        "main": run_main,
        "kv": run_kv,
        "tuning": run_tuning,
        "seeds": run_seeds,
        "sweep": run_sweep,
        "chunks": run_chunks,
        "validation": lambda st, _c, _x: st.results.__setitem__(
            "validation", run_validation(st.quick, st.jobs)
        ),
    }
    t0 = time.perf_counter()
    for name in only.split(","):
        sections[name](study, cost, ctx)
    text = markdown(study, default_slo(cost))
    if only == "chunks":  # the run's setting is the chunk section's
        cost = load_profile(CHUNK_PROFILE)
    print(text)
    name = {"chunks": "policies-chunks.json", "validation": "policies-validation.json"}.get(
        only, "policies.json"
    )
    out = Path(args.out or Path(__file__).parent / "results" / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = study_result("policies", cost, args.quick, t0, **study.results, markdown=text)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
