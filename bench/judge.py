"""The validation set's judge (bench/validation.py): a candidate by its worst point.

A point's bar is sj-mlfq, the paper's policy, unless it thrashes there (time between
tokens P99 over 2x FCFS's: round robin buys its mean with every stream's rhythm); then
the best non-oracle policy that does not. Past capacity (FCFS does not sustain the
load) the per-token average is not enough: first tokens and goodput count too.
"""

from __future__ import annotations

ORACLES = ("srpt",)  # knows output lengths: never a candidate, never the best to beat
GOODPUT_TOL = 0.99  # past capacity, a goodput this close to the best counts as the best
TTFT_ON_TIME = 1.0  # s: a mean first token this soon meets the target whatever the ratio
THRASH_TARGETS = ("TBT P99", "swaps/request")  # the misses that rule a candidate out


def thrashes(r: dict, fcfs: dict) -> bool:
    """Its time between tokens P99 over 2x FCFS's: it round-robins its way to a mean."""
    return bool(r.get("tbt_p99") and fcfs.get("tbt_p99") and r["tbt_p99"] > 2 * fcfs["tbt_p99"])


def bar(runs: dict) -> tuple[str, dict[str, dict]]:
    """A point's reference and the candidates a regret is taken against: sj-mlfq, unless
    it thrashes there, then the best non-oracle policy (by average) that does not; and
    every non-oracle policy that does not thrash (a thrashing one is no bar, nor is one
    of the default's own ablations)."""
    f = runs["fcfs"]
    fair = {
        k: r
        for k, r in runs.items()
        if k not in ORACLES and "[" not in k and not thrashes(r, f)  # (no ablation either)
    }
    ref = "sj-mlfq" if "sj-mlfq" in fair else min(fair, key=lambda k: fair[k]["avg"])
    return ref, fair


def worst_case(res: dict, label: str) -> dict:
    """A candidate judged by its worst validation point, not its mean.

    Regret at a point: its average (and P95) over the best candidate's there that does
    not thrash (`bar`). The targets, checked at every point: average <= 1.05x the
    reference's (sj-mlfq, or the best non-thrashing candidate where sj-mlfq thrashes),
    P95 <= 1.05x the better of FCFS's and the reference's, time between tokens P99 <=
    2x FCFS's, at most one swap per request; past capacity (FCFS does not sustain the
    load) also mean time to first token <= 2x the best candidate's and goodput (jobs
    within the SLO per second) >= the best candidate's (`GOODPUT_TOL`). Each miss
    names its point.
    """
    worst = {"avg": (0.0, ""), "p95": (0.0, "")}
    misses: list[str] = []
    swaps = (0.0, "")
    for name, case in res["cases"].items():
        for load, block in case["loads"].items():
            runs, at = block["runs"], f"{name}@{load}"
            ref_name, fair = bar(runs)
            r, f, ref = runs[label], runs["fcfs"], runs[ref_name]
            for metric in ("avg", "p95"):
                regret = r[metric] / min(x[metric] for x in fair.values())
                if regret > worst[metric][0]:
                    worst[metric] = (regret, at)
            if r["avg"] > 1.05 * ref["avg"]:
                misses.append(f"{at} avg {r['avg'] / ref['avg']:.2f}x {ref_name}")
            if r["p95"] > 1.05 * min(f["p95"], ref["p95"]):
                misses.append(f"{at} P95 {r['p95'] / min(f['p95'], ref['p95']):.2f}x best")
            if thrashes(r, f):
                misses.append(f"{at} TBT P99 {r['tbt_p99'] / f['tbt_p99']:.1f}x fcfs")
            per = r.get("swaps_per_request", 0.0)
            if per > 1.0:
                misses.append(f"{at} {per:.2f} swaps/request")
            swaps = max(swaps, (per, at))
            if not f.get("sustainable", True):
                misses += past_capacity_misses(r, fair, at)
    return {
        "worst_avg_regret": worst["avg"],
        "worst_p95_regret": worst["p95"],
        "most_swaps_per_request": swaps,
        "misses": misses,
    }


def past_capacity_misses(r: dict, fair: dict[str, dict], at: str) -> list[str]:
    """Past capacity the per-token average is not enough: first tokens and goodput."""
    out = []
    ttft = min(x["ttft"] for x in fair.values() if "ttft" in x) if "ttft" in r else None
    if ttft is not None and r["ttft"] > max(2 * ttft, TTFT_ON_TIME):
        out.append(f"{at} mean TTFT {r['ttft'] / ttft:.2f}x best")
    if "goodput" in r:  # within 1%: the last job's finish sets each run's makespan
        good = max(x.get("goodput", 0.0) for x in fair.values())
        if r["goodput"] < GOODPUT_TOL * good:
            out.append(f"{at} goodput {r['goodput'] / good:.2f}x best")
    return out


def choose_default(res: dict) -> tuple[str | None, dict[str, float]]:
    """The default by the worst case: among the non-oracle candidates that never thrash
    (no point misses the time-between-tokens or swap target), the one whose worst
    regret, average or P95, is smallest. Returns it (None: none qualifies) and each
    qualifying candidate's worst regret."""
    labels = list(next(iter(next(iter(res["cases"].values()))["loads"].values()))["runs"])
    worst: dict[str, float] = {}
    for x in labels:
        if x in ORACLES or x == "fcfs":
            continue
        w = worst_case(res, x)
        if any(t in miss for miss in w["misses"] for t in THRASH_TARGETS):
            continue
        worst[x] = max(w["worst_avg_regret"][0], w["worst_p95_regret"][0])
    return (min(worst, key=worst.__getitem__) if worst else None), worst
