"""Where the README's conversation example past capacity puts its P95: which jobs make
the tail of per-token latency under the default, and how much later they start than
under FCFS.

    .venv/bin/python bench/conv_tail.py                  # both runs (~6 min on 2 cores)
    .venv/bin/python bench/conv_tail.py --from DIR       # DIR/fcfs.csv, DIR/default.csv

The whole Azure 2023 conversation trace at `--time-scale` 0.5 (2.77 req/s, past what
any policy sustains on opt-13b-a100), `fsd simulate --jobs-csv`. For the default's P95
tail (its slowest 5% per output token) and for every prompt-length band: prompt and
output lengths, the wait before the first token under each policy, and the levels it
climbed. Prints a table, writes bench/results/conv-tail.json.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import table_of, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "scenarios" / "traces" / "azure-llm-2023-conv.csv"
OUT = ROOT / "bench" / "results" / "conv-tail.json"
BANDS = ((0, 512), (512, 1024), (1024, 2048), (2048, 1 << 30))


def simulate(scale: float, folder: Path) -> None:
    """Both policies on the whole trace, their per-job records in `folder`."""
    cmd = [
        sys.executable, "-m", "fsd.cli", "simulate", "--trace", str(TRACE),
        "--time-scale", str(scale), "--policies", "fcfs,default", "--profile", "opt-13b-a100",
        "--jobs", "2", "--jobs-csv", str(folder),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)


def load(path: Path) -> dict[str, dict[str, float]]:
    with path.open() as f:
        return {
            r["job_id"]: {k: float(v) for k, v in r.items() if k != "job_id"}
            for r in csv.DictReader(f)
        }


def spread(values: list[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    return {"p10": float(np.percentile(v, 10)), "median": float(np.median(v)),
            "p90": float(np.percentile(v, 90)), "mean": float(v.mean())}  # fmt: skip


def analyse(fcfs: dict, default: dict) -> dict:
    ids = list(default)
    ptl = np.array([default[i]["per_token_s"] for i in ids])
    cut = float(np.percentile(ptl, 95))
    tail = [i for i, x in zip(ids, ptl, strict=True) if x >= cut]
    of = lambda jobs, field, src: [src[i][field] for i in jobs]  # noqa: E731
    bands = []
    for lo, hi in BANDS:
        band = [i for i in ids if lo <= default[i]["prompt_tokens"] < hi]
        if band:
            bands.append({
                "prompts": f"{lo}-{hi if hi < 1 << 30 else 'max'}", "jobs": len(band),
                "in_tail": len(set(band) & set(tail)),
                "ttft_default": spread(of(band, "ttft_s", default)),
                "ttft_fcfs": spread(of(band, "ttft_s", fcfs)),
            })  # fmt: skip
    return {
        "requests": len(ids),
        "p95_per_token_s": {"default": cut, "fcfs": float(np.percentile([fcfs[i]["per_token_s"] for i in ids], 95))},
        "avg_per_token_s": {"default": float(ptl.mean()), "fcfs": float(np.mean([fcfs[i]["per_token_s"] for i in ids]))},
        "tail": {
            "jobs": len(tail),
            "prompt_tokens": spread(of(tail, "prompt_tokens", default)),
            "output_tokens": spread(of(tail, "output_tokens", default)),
            "ttft_default": spread(of(tail, "ttft_s", default)),
            "ttft_fcfs": spread(of(tail, "ttft_s", fcfs)),
            "per_token_fcfs": spread(of(tail, "per_token_s", fcfs)),
            "promotions": spread(of(tail, "promotions", default)),
            "preemptions": spread(of(tail, "preemptions", default)),
            "wait_share": float(np.median([default[i]["ttft_s"] / default[i]["latency_s"] for i in tail])),
        },
        "bands": bands,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument(
        "--from", dest="src", type=Path, default=None, help="existing --jobs-csv folder"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.src or Path(tmp)
        if args.src is None:
            simulate(args.time_scale, folder)
        res = analyse(load(folder / "fcfs.csv"), load(folder / "default.csv"))
    t = res["tail"]
    console = Console()
    console.print(
        f"{res['requests']} requests: P95 per token {res['p95_per_token_s']['default']:.1f} s "
        f"(fcfs {res['p95_per_token_s']['fcfs']:.1f}); average {res['avg_per_token_s']['default']:.2f} "
        f"(fcfs {res['avg_per_token_s']['fcfs']:.2f}). The default's P95 tail, {t['jobs']} jobs: "
        f"prompts median {t['prompt_tokens']['median']:.0f}, outputs median "
        f"{t['output_tokens']['median']:.0f}, first token median {t['ttft_default']['median']:.0f} s "
        f"(the same jobs under fcfs: {t['ttft_fcfs']['median']:.0f} s), {t['wait_share']:.0%} of "
        f"their latency before the first token, {t['promotions']['median']:.0f} promotions"
    )
    rows = [{**b, "d": b["ttft_default"]["mean"], "dp": b["ttft_default"]["p90"],
             "f": b["ttft_fcfs"]["mean"], "fp": b["ttft_fcfs"]["p90"]} for b in res["bands"]]  # fmt: skip
    console.print(table_of(
        "first token by prompt length (s)", "prompt tokens | jobs | in the P95 tail | "
        "default mean | default p90 | fcfs mean | fcfs p90",
        "{prompts} | {jobs} | {in_tail} | {d:.0f} | {dp:.0f} | {f:.0f} | {fp:.0f}", rows, left=1,
    ))  # fmt: skip
    write_result(
        OUT, {"trace": TRACE.name, "time_scale": args.time_scale, "profile": "opt-13b-a100"}, **res
    )
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
