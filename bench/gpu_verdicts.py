"""The GPU check's verdicts on the step itself: swaps hidden behind it, the step
against its roofline, fsd against transformers, a ragged paged decode against a
uniform one. Each takes what one bench wrote (None when it did not run) and says
MET, NOT MET or NO DATA with the worst figure (bench/gpu_summary.py collects them).
"""

from __future__ import annotations

from typing import Any

MET, NOT_MET, NO_DATA = "MET", "NOT MET", "NO DATA"
SWAP_GOAL = 1.15  # a decode step during a swap / the step alone
HF_GOAL = {1: 3.0, 32: 2.0}  # fsd tokens/s over transformers', by batch
RAGGED_GOAL = 1.1  # a ragged batch's time / a uniform one's with the same bytes


def verdict(goal: str, status: str, detail: str, **figures: Any) -> dict:
    return {"goal": goal, "status": status, "detail": detail, **figures}


def _worst(
    goal: str, data: dict | None, key: str, field: str, missing: str
) -> tuple[dict, dict | None]:
    """The row of `data[key]` with the largest `field`, or a NO DATA verdict saying `missing`."""
    rows = (data or {}).get(key) or []
    if not rows:
        return {}, verdict(goal, NO_DATA, missing)
    return max(rows, key=lambda r: r[field]), None


def swap_overlap_verdict(swap: dict | None) -> dict:
    goal = f"decode step during a swap-out or swap-in <= {SWAP_GOAL}x the step alone"
    staged = {
        "overlap": [r for r in (swap or {}).get("overlap") or [] if r.get("slice") != "whole"]
    }
    worst, none = _worst(
        goal, staged, "overlap", "inflation", "bench/swap.py wrote no overlap rows"
    )
    if none is not None:
        return none
    detail = (
        f"worst x{worst['inflation']:.2f}: swap {worst['direction']} of {worst['blocks']} blocks "
        f"({worst.get('host_blocks', '?')} host blocks), {worst['step_alone_ms']:.2f} -> "
        f"{worst['step_during_swap_ms']:.2f} ms"
    )
    status = MET if worst["inflation"] <= SWAP_GOAL else NOT_MET
    return verdict(goal, status, detail, worst_inflation=worst["inflation"])


def roofline_rows_verdict(engine_gpu: dict | None) -> dict:
    goal = "decode step <= 1.5x its roofline at batch 1 and <= 2x at batch 32 (weights + KV once)"
    rows = [
        r
        for r in (engine_gpu or {}).get("rows") or []
        if r.get("target_x") and r.get("scheduled", "ahead") == "ahead"  # (not the baseline)
    ]
    if not rows:
        return verdict(goal, NO_DATA, "bench/engine_gpu.py wrote no row with a target")
    worst = max(rows, key=lambda r: r["x_roofline"] / r["target_x"])
    over = [r for r in rows if r["x_roofline"] > r["target_x"]]
    detail = (
        f"worst {worst['model']} batch {worst['batch']}: {worst['step_ms']:.3f} ms = "
        f"{worst['x_roofline']:.2f}x roofline (target {worst['target_x']}x; host not hidden "
        f"{worst['host_not_hidden_ms']:.3f} ms)"
    )
    if over:
        detail = f"{len(over)}/{len(rows)} rows over; " + detail
    return verdict(goal, NOT_MET if over else MET, detail, worst_x=worst["x_roofline"])


def hf_verdict(hf: dict | None) -> dict:
    goal = "tokens/s >= 3x transformers at batch 1 and >= 2x at batch 32 (same GPU and weights)"
    runs = [r for r in (hf or {}).get("runs") or [] if r["batch"] in HF_GOAL]
    if not runs:
        return verdict(goal, NO_DATA, "bench/hf_compare.py wrote no run at batch 1 or 32")
    short = [r for r in runs if r["ratio"] < HF_GOAL[r["batch"]]]
    detail = "; ".join(
        f"batch {r['batch']}: {r['ratio']:.2f}x ({r['sequences_equal']} same)" for r in runs
    )
    return verdict(goal, NOT_MET if short else MET, detail)


def ragged_verdict(kernels: dict | None) -> dict:
    goal = f"a ragged paged decode <= {RAGGED_GOAL}x a uniform one with the same bytes"
    missing = "bench/kernels.py wrote no ragged/uniform pair"
    worst, none = _worst(goal, kernels, "ragged_vs_uniform", "ratio", missing)
    if none is not None:
        return none
    detail = f"worst {worst['ratio']:.2f}x ({worst.get('case', '?')})"
    return verdict(
        goal, MET if worst["ratio"] <= RAGGED_GOAL else NOT_MET, detail, worst_ratio=worst["ratio"]
    )


def step_verdicts(
    swap: dict | None, engine_gpu: dict | None, hf: dict | None, kernels: dict | None
) -> list[dict]:
    return [
        swap_overlap_verdict(swap),
        roofline_rows_verdict(engine_gpu),
        hf_verdict(hf),
        ragged_verdict(kernels),
    ]
