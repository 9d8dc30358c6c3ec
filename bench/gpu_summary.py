"""The verdicts and the markdown summary of one `scripts/gpu-check.sh` run.

    python3 bench/gpu_summary.py slug "NVIDIA H100 80GB HBM3"    # -> h100
    python3 bench/gpu_summary.py report bench/results/gpu-h100   # summary.md + summary.json

`report` reads what the check's steps left in the folder (steps.tsv, the pytest JUnit
files gpu-tests.xml and parity.xml, kernels.json, swap.json, parallel.json,
engine.json, engine-gpu.json, hf.json; any may be missing) and prints which goal each
figure meets:

- paged decode >= 85% of measured copy bandwidth at batch >= 16 and context >= 2048;
- paged decode no slower than the best installed peer on those same rows;
- batch-1 decode of the 1B-class model <= 1.5x its weight-read roofline;
- and bench/gpu_verdicts.py's: a decode step during a swap <= 1.15x alone, the step
  against its roofline per model at batches 1 and 32, fsd against transformers, a
  ragged paged decode against a uniform one.

The other figures (prefill TFLOP/s against the peer, store_kv and swap bandwidth,
TP/PP step time) have no goal and are reported as measured. Standard library only: it runs before (and without) the project's venv.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/gpu_verdicts.py

BW_GOAL = 0.85
BW_MIN_BATCH = 16
BW_MIN_CONTEXT = 2048
ROOFLINE_GOAL = 1.5  # step time / weight-read time
MET, NOT_MET, NO_DATA = "MET", "NOT MET", "NO DATA"


def gpu_slug(name: str) -> str:
    """A short folder name for a GPU: 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA GeForce
    RTX 4090' -> 'rtx-4090', 'Tesla V100-SXM2-16GB' -> 'v100'; 'gpu' when nothing fits."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    words = [w for w in words if w not in ("nvidia", "geforce", "tesla", "amd", "radeon")]
    for i, word in enumerate(words):
        if re.search(r"\d", word) and not re.fullmatch(r"\d+gb", word):
            if i and words[i - 1] in ("rtx", "gtx", "quadro", "titan", "instinct"):
                return f"{words[i - 1]}-{word}"
            return word
    return "-".join(words[:2]) or "gpu"


# ----------------------------------------------------------------------------- inputs


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_steps(path: Path) -> list[dict]:
    """steps.tsv: one line per step, `name<TAB>rc<TAB>seconds<TAB>limit`."""
    steps = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return steps
    for line in lines:
        parts = line.split("\t")
        if len(parts) >= 4:
            name, rc, secs, limit = parts[:4]
            rc_i = int(rc) if rc.lstrip("-").isdigit() else None
            steps.append(
                {"step": name, "rc": rc_i, "seconds": int(secs), "limit": int(limit),
                 "status": _step_status(rc, rc_i)}
            )  # fmt: skip
    return steps


def _step_status(rc: str, code: int | None) -> str:
    if code is None:
        return rc  # "skipped" and the like, written by the script
    if code == 0:
        return "ok"
    return "timed out" if code in (124, 137) else f"failed (rc {code})"


def read_junit(path: Path) -> dict | None:
    """Counts of one pytest --junitxml file: tests, failures, errors, skipped, passed."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors")}
    counts["skipped"] = sum(int(s.get("skipped", 0)) for s in suites)
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


# ----------------------------------------------------------------------------- verdicts


def _verdict(goal: str, status: str, detail: str, **figures: Any) -> dict:
    return {"goal": goal, "status": status, "detail": detail, **figures}


def _row_name(r: dict) -> str:
    ragged = " ragged" if r.get("ragged") else ""
    return f"{r['num_heads']}/{r['num_kv_heads']} b{r['batch']} ctx{r['context']}{ragged}"


def _goal_rows(kernels: dict | None) -> list[dict]:
    rows = (kernels or {}).get("decode") or []
    return [r for r in rows if r["batch"] >= BW_MIN_BATCH and r["context"] >= BW_MIN_CONTEXT]


def decode_bandwidth_verdict(kernels: dict | None) -> dict:
    goal = (
        f"Triton paged decode >= {100 * BW_GOAL:.0f}% of measured copy bandwidth "
        f"(batch >= {BW_MIN_BATCH}, context >= {BW_MIN_CONTEXT})"
    )
    rows = _goal_rows(kernels)
    if not rows:
        return _verdict(goal, NO_DATA, "no decode row at that batch and context")
    worst = min(rows, key=lambda r: r["fraction_of_copy"])
    short = [r for r in rows if r["fraction_of_copy"] < BW_GOAL]
    status = NOT_MET if short else MET
    detail = f"worst {100 * worst['fraction_of_copy']:.1f}% of copy ({_row_name(worst)})"
    if short:
        detail = f"{len(short)}/{len(rows)} rows below; " + detail
    return _verdict(goal, status, detail, worst_fraction=worst["fraction_of_copy"])


def decode_peer_verdict(kernels: dict | None) -> dict:
    goal = (
        f"Triton paged decode no slower than the best installed peer "
        f"(batch >= {BW_MIN_BATCH}, context >= {BW_MIN_CONTEXT})"
    )
    rows = [r for r in _goal_rows(kernels) if r.get("best_peer_ms")]
    if not rows:
        return _verdict(goal, NO_DATA, "no peer timed on those rows")
    worst = min(rows, key=lambda r: r["speedup_vs_best_peer"])
    slower = [r for r in rows if r["speedup_vs_best_peer"] < 1.0]
    peers = sorted({r["best_peer"] for r in rows})
    detail = (
        f"worst {worst['speedup_vs_best_peer']:.2f}x {worst['best_peer']} ({_row_name(worst)}); "
        f"peers: {', '.join(peers)}"
    )
    if slower:
        detail = f"{len(slower)}/{len(rows)} rows slower; " + detail
    return _verdict(
        goal, NOT_MET if slower else MET, detail, worst_speedup=worst["speedup_vs_best_peer"]
    )


def roofline_verdict(engine: dict | None, engine_gpu: dict | None = None) -> dict:
    goal = f"batch-1 decode of a 1B-class model <= {ROOFLINE_GOAL}x the weight-read roofline"
    rl = (engine or {}).get("roofline")
    ones = [r for r in (engine_gpu or {}).get("rows") or [] if r["batch"] == 1]
    if not rl and ones:  # bench/engine_gpu.py's batch-1 rows, the worst of its models
        worst = max(ones, key=lambda r: r["x_roofline"])
        rl = {"model": worst["model"], "step_ms": worst["step_ms"],
              "roofline_step_ms": worst["roofline_ms"], "copy_gb_s": engine_gpu["copy_gb_s"]}  # fmt: skip
    if not rl:
        return _verdict(goal, NO_DATA, "neither bench/engine.py nor bench/engine_gpu.py wrote a roofline")
    ratio = rl["step_ms"] / rl["roofline_step_ms"]
    detail = (
        f"{rl.get('model', '?')}: step {rl['step_ms']:.2f} ms vs roofline "
        f"{rl['roofline_step_ms']:.2f} ms = {ratio:.2f}x ({rl['copy_gb_s']:.0f} GB/s copy)"
    )
    return _verdict(goal, MET if ratio <= ROOFLINE_GOAL else NOT_MET, detail, ratio=ratio)


def tests_verdict(goal: str, junit: dict | None) -> dict:
    if junit is None:
        return _verdict(goal, NO_DATA, "no JUnit file (the step did not run or crashed)")
    bad = junit["failures"] + junit["errors"]
    detail = f"{junit['passed']} passed, {bad} failed, {junit['skipped']} skipped"
    if junit["passed"] == 0 and not bad:
        return _verdict(goal, NO_DATA, detail + " (nothing ran)")
    return _verdict(goal, NOT_MET if bad else MET, detail)


# ----------------------------------------------------------------------------- figures


def figures(kernels: dict | None, swap: dict | None, parallel: dict | None) -> list[str]:
    """One line per measured figure that has no goal."""
    lines = []
    k = kernels or {}
    if k.get("copy"):
        lines.append(f"device copy bandwidth: {k['copy']['gbps']:.0f} GB/s (read + write)")
    pre = [r for r in k.get("prefill") or [] if r.get("best_peer_ms")]
    for r in pre:
        lines.append(
            f"paged prefill {r['case']}: {r['tflops']:.0f} TFLOP/s, "
            f"{r['speedup_vs_best_peer']:.2f}x {r['best_peer']}"
        )
    for r in k.get("store_kv") or []:
        lines.append(
            f"store_kv {r['tokens']} tokens: {r['gbps']:.0f} GB/s "
            f"({100 * r['fraction_of_copy']:.0f}% of copy, {r['speedup_vs_torch']:.2f}x torch)"
        )
    for r in (swap or {}).get("bandwidth") or []:
        lines.append(
            f"swap {r['direction']} ({r['mode']}) {r['blocks']} blocks: {r['gbps']:.1f} GB/s, "
            f"{100 * r['fraction_of_pinned']:.0f}% of a contiguous pinned copy"
        )
    for r in (swap or {}).get("overlap") or []:
        lines.append(
            f"decode step while swapping {r['direction']}"
            f"{' (' + r['host_blocks'] + ' host blocks)' if 'host_blocks' in r else ''}: "
            f"x{r['inflation']:.2f} "
            f"({r['step_alone_ms']:.2f} -> {r['step_during_swap_ms']:.2f} ms)"
        )
    par = parallel or {}
    if par.get("skipped"):
        lines.append(f"parallel: skipped ({par['skipped']})")
    for r in par.get("results") or []:
        if "step_ms" in r:
            lines.append(f"parallel {r['layout']}: step {r['step_ms']:.2f} ms")
    return lines


def build(folder: Path) -> dict:
    from gpu_verdicts import step_verdicts

    kernels = read_json(folder / "kernels.json")
    swap = read_json(folder / "swap.json")
    engine_gpu = read_json(folder / "engine-gpu.json")
    summary = {
        "folder": str(folder),
        "steps": read_steps(folder / "steps.tsv"),
        "verdicts": [
            tests_verdict("GPU tests (pytest -m gpu)", read_junit(folder / "gpu-tests.xml")),
            tests_verdict("HF parity on CUDA (fp16/bf16)", read_junit(folder / "parity.xml")),
            decode_bandwidth_verdict(kernels),
            decode_peer_verdict(kernels),
            roofline_verdict(read_json(folder / "engine.json"), engine_gpu),
            *step_verdicts(swap, engine_gpu, read_json(folder / "hf.json"), kernels),
        ],
        "figures": figures(kernels, swap, read_json(folder / "parallel.json")),
    }
    gpu = ((kernels or {}).get("machine") or {}).get("gpu")
    summary["gpu"] = gpu
    return summary


def markdown(summary: dict) -> str:
    out = [f"# GPU check: {summary.get('gpu') or Path(summary['folder']).name}", ""]
    out += ["| goal | verdict | figure |", "| --- | --- | --- |"]
    out += [f"| {v['goal']} | {v['status']} | {v['detail']} |" for v in summary["verdicts"]]
    if summary["figures"]:
        out += ["", "Measured, no goal:", ""] + [f"- {line}" for line in summary["figures"]]
    if summary["steps"]:
        out += ["", "| step | status | seconds | limit |", "| --- | --- | --- | --- |"]
        out += [
            f"| {s['step']} | {s['status']} | {s['seconds']} | {s['limit']} |"
            for s in summary["steps"]
        ]
    return "\n".join(out) + "\n"


def report(folder: Path) -> int:
    summary = build(folder)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (folder / "summary.md").write_text(markdown(summary))
    for v in summary["verdicts"]:
        print(f"{v['status']:>8}  {v['goal']}: {v['detail']}")
    for line in summary["figures"]:
        print(f"          {line}")
    print(f"wrote {folder / 'summary.md'} and summary.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("slug", help="short folder name of a GPU").add_argument("name")
    sub.add_parser("report", help="verdicts and summary.md of a results folder").add_argument(
        "folder", type=Path
    )
    args = ap.parse_args(argv)
    if args.cmd == "slug":
        print(gpu_slug(args.name))
        return 0
    return report(args.folder)


if __name__ == "__main__":
    sys.exit(main())
