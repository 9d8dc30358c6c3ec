"""Every scheduling decision's outcome, dumped to compare two commits: a refactor of
the scheduler must leave them bit-identical.

    .venv/bin/python bench/decisions.py --out /tmp/before.json     # on the old commit
    .venv/bin/python bench/decisions.py --out /tmp/after.json      # on the new one
    .venv/bin/python bench/decisions.py --compare /tmp/before.json /tmp/after.json

Runs the MLFQ family and gittins over bench/policies.py's main section (--quick) and
the validation set (600 requests a point): 204 runs, about 5 minutes on one core.
Each run keeps every metric the simulator reports but its wall time; `--compare`
prints the runs and metrics that differ (none: the decisions are the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import policies as P  # noqa: E402
import validation as V  # noqa: E402

from fsd.cost.profiles import load_profile  # noqa: E402
from fsd.sim.capacity import max_context_of  # noqa: E402
from fsd.sim.runner import run_many  # noqa: E402

FAMILY = ("fsd", "sj-mlfq", "mlfq", "gittins")
WALL = ("sim_wall_s", "wall_s", "sim_s")  # the one thing a rerun may change


def collect() -> dict[str, dict]:
    out: dict[str, dict] = {"main": {}, "validation": {}}
    cost = load_profile(P.PROFILE)
    specs = [P.base_spec(p, p) for p in FAMILY]
    for case in P.CASES:
        out["main"][case.name] = run_many(specs, cost, P.load(case, True, max_context_of(cost)))
        print(f"  main {case.name}", file=sys.stderr, flush=True)
    vcost = load_profile(V.PROFILE)
    for i, case in enumerate(V.CASES):
        runs = [replace(V.spec(p, p), num_gpu_blocks=case.num_gpu_blocks) for p in FAMILY]
        for load in case.loads:
            w = case.build(load, round(600 * case.share), V.VALIDATION_SEED + i)
            out["validation"][f"{case.name}@{load:g}"] = run_many(runs, vcost, w)
        print(f"  validation {case.name}", file=sys.stderr, flush=True)
    return out


def differences(a: dict, b: dict) -> tuple[int, list[str]]:
    """How many runs were compared, and each (section, case, policy, metric) that differs."""
    runs, diffs = 0, []
    for section, cases in a.items():
        for case, rows in cases.items():
            for policy, row in rows.items():
                other = b.get(section, {}).get(case, {}).get(policy)
                if other is None:
                    diffs.append(f"{section} {case} {policy}: missing")
                    continue
                runs += 1
                diffs += [
                    f"{section} {case} {policy} {k}: {v} != {other.get(k)}"
                    for k, v in row.items()
                    if k not in WALL and other.get(k) != v
                ]
    return runs, diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the runs here")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        runs, diffs = differences(a, b)
        print("\n".join(diffs[:50]))
        print(f"{runs} runs compared, {len(diffs)} differences")
        sys.exit(1 if diffs else 0)
    if not args.out:
        ap.error("--out or --compare")
    Path(args.out).write_text(json.dumps(collect(), indent=1, sort_keys=True, default=str))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
