"""Throughput of tensor x pipeline parallel serving on Ray CPU actors.

    .venv/bin/python bench/parallel.py             # tiny preset, tp x pp in 1x1 2x1 1x2 2x2

This is a CPU benchmark: the workers are CPU actors sharing this machine's cores,
tensor parallelism all-reduces through gloo in float32 and activations between
pipeline stages go through Ray's object store. It measures what the distributed path
costs (and that it works), not the speed-up GPUs with NCCL would give: on CPU,
splitting a tiny model only adds communication. "in-process" is the ordinary
single-device engine; "1x1 ray" is the same model on one Ray actor.

Prints a table and writes bench/results/parallel-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

from fsd import LLM, SamplingParams  # noqa: E402
from fsd.cost import CostModel  # noqa: E402
from fsd.engine.ray_cluster import ensure_ray  # noqa: E402

LAYOUTS = [(1, 1, False), (1, 1, True), (2, 1, True), (1, 2, True), (2, 2, True)]


def prompts(n: int, length: int) -> list[list[int]]:
    return [[(7 * i + 3 * k) % 250 + 1 for k in range(length)] for i in range(n)]


def run(model: str, tp: int, pp: int, ray: bool, args: argparse.Namespace, profile: str) -> dict:
    options = {"tp": tp, "pp": pp, "device": "cpu"}
    if ray and tp * pp == 1:
        options["ray_address"] = args.ray_address_for_1x1
    t0 = time.perf_counter()
    llm = LLM(
        model,
        policy="fcfs",
        max_batch_size=args.batch,
        num_gpu_blocks=args.blocks,
        profile=profile,
        **options,
    )
    startup = time.perf_counter() - t0
    params = SamplingParams(max_tokens=args.output, ignore_eos=True)
    try:
        llm.generate(prompts(2, 8), SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
        best = None
        for _ in range(args.repeats):
            start = time.perf_counter()
            outs = llm.generate(prompts(args.requests, args.prompt), params)
            elapsed = time.perf_counter() - start
            best = elapsed if best is None else min(best, elapsed)
        tokens = sum(len(o.token_ids) for o in outs)
        iterations = llm.engine.iterations
    finally:
        llm.close()
    assert best is not None
    return {
        "layout": f"{tp}x{pp}" + (" ray" if ray else " in-process"),
        "tp": tp,
        "pp": pp,
        "ray": ray,
        "workers": tp * pp if ray else 0,
        "startup_s": startup,
        "seconds": best,
        "output_tokens": tokens,
        "tokens_per_s": tokens / best,
        "engine_iterations": iterations,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens per request")
    ap.add_argument("--output", type=int, default=32, help="output tokens per request")
    ap.add_argument("--batch", type=int, default=8, help="max_batch_size (per micro-batch)")
    ap.add_argument("--blocks", type=int, default=256, help="device KV blocks")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "parallel-cpu.json"))
    args = ap.parse_args()

    ray, _ = ensure_ray(None, num_cpus=max(4, os.cpu_count() or 1))
    # a tp=pp=1 engine runs on one Ray actor when given a cluster to join
    args.ray_address_for_1x1 = ray.get_runtime_context().gcs_address
    with tempfile.TemporaryDirectory() as tmp:
        profile = str(Path(tmp) / "fixed.json")  # skip calibration: throughput is timed directly
        CostModel(name="bench-fixed").save(profile)
        rows = [run(args.model, tp, pp, use_ray, args, profile) for tp, pp, use_ray in LAYOUTS]

    table = Table(title=f"{args.model} on CPU actors (gloo, fp32) -- CPU, not GPU numbers")
    for col in ("layout", "workers", "tokens/s", "vs in-process", "wall s", "start-up s"):
        table.add_column(col, justify="right")
    base = rows[0]["tokens_per_s"]
    for r in rows:
        table.add_row(
            r["layout"],
            str(r["workers"]),
            f"{r['tokens_per_s']:.0f}",
            f"{r['tokens_per_s'] / base:.2f}x",
            f"{r['seconds']:.2f}",
            f"{r['startup_s']:.1f}",
        )
    Console().print(table)
    result = {
        "benchmark": "parallel",
        "note": (
            "CPU only: tp x pp workers are Ray CPU actors sharing this machine's cores; "
            "tensor parallelism all-reduces over gloo in float32 and pipeline activations "
            "pass through Ray's object store, so splitting a tiny model on CPU is slower "
            "than one process. These numbers show the distributed path's overhead, not "
            "GPU (NCCL) scaling."
        ),
        "model": args.model,
        "workload": {
            "requests": args.requests,
            "prompt_tokens": args.prompt,
            "output_tokens": args.output,
            "max_batch_size": args.batch,
            "policy": "fcfs",
        },
        "machine": describe_machine(torch.device("cpu")),
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
