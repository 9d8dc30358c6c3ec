"""Throughput of tensor x pipeline parallel serving on Ray actors: CPU (gloo) or GPUs (NCCL).

    .venv/bin/python bench/parallel.py                  # tiny preset, tp x pp in 1x1 2x1 1x2 2x2
    .venv/bin/python bench/parallel.py --device cuda    # OPT-1.3B fp16, one GPU per worker

This is a CPU benchmark: the workers are CPU actors sharing this machine's cores,
tensor parallelism all-reduces through gloo in float32 and activations between
pipeline stages go through Ray's object store. It measures what the distributed path
costs (and that it works), not the speed-up GPUs with NCCL would give: on CPU,
splitting a tiny model only adds communication. "in-process" is the ordinary
single-device engine; "1x1 ray" is the same model on one Ray actor.

--device cuda runs TP=2 and PP=2 (and 2x2 with 4 GPUs) against TP=1 in-process on
the GPUs, each worker a Ray actor holding one GPU, tensor parallelism all-reducing
over NCCL; the figure is the engine step time (wall time / engine iterations) and
tokens/s. With fewer than 2 GPUs, or without Ray, it says why, writes that to the JSON
and exits 0.

Prints a table and writes bench/results/parallel-cpu.json (parallel-<gpu>.json on CUDA).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine, machine_slug, table_of  # noqa: E402

from fsd import LLM, SamplingParams  # noqa: E402
from fsd.cost import CostModel  # noqa: E402

LAYOUTS = [(1, 1, False), (1, 1, True), (2, 1, True), (1, 2, True), (2, 2, True)]
GPU_LAYOUTS = [(1, 1, False), (2, 1, True), (1, 2, True), (2, 2, True)]


def prompts(n: int, length: int) -> list[list[int]]:
    return [[(7 * i + 3 * k) % 250 + 1 for k in range(length)] for i in range(n)]


def run(model: str, tp: int, pp: int, ray: bool, args: argparse.Namespace, profile: str) -> dict:
    options = {"tp": tp, "pp": pp, "device": args.device}
    if args.device == "cuda":
        options["dtype"] = args.dtype
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
        best, steps = None, 0
        for _ in range(args.repeats):
            before = llm.engine.iterations
            start = time.perf_counter()
            outs = llm.generate(prompts(args.requests, args.prompt), params)
            elapsed = time.perf_counter() - start
            if best is None or elapsed < best:
                best, steps = elapsed, llm.engine.iterations - before
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
        "step_ms": 1e3 * best / max(steps, 1),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", default=None, help="default: tiny on CPU, opt-1.3b on CUDA")
    ap.add_argument("--dtype", default="float16", help="weights on CUDA")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens per request")
    ap.add_argument("--output", type=int, default=32, help="output tokens per request")
    ap.add_argument("--batch", type=int, default=8, help="max_batch_size (per micro-batch)")
    ap.add_argument("--blocks", type=int, default=256, help="device KV blocks")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="default: results/parallel-<device>.json")
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    args.model = args.model or ("opt-1.3b" if cuda else "tiny")
    if args.out is None:
        slug = machine_slug(torch.device("cuda")) if cuda and torch.cuda.is_available() else "cpu"
        args.out = str(Path(__file__).parent / "results" / f"parallel-{slug}.json")
    return args


def gpu_skip_reason() -> str | None:
    """Why --device cuda cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.device_count() < 2:
        return f"{torch.cuda.device_count()} GPU: TP=2 and PP=2 need at least 2"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'ray>=2.9')"
    return None


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    if args.device == "cuda":
        title = f"{args.model} {args.dtype} on GPUs (NCCL), one GPU per worker"
    else:
        title = f"{args.model} on CPU actors (gloo, fp32) -- CPU, not GPU numbers"
    columns = "layout | workers | tokens/s | vs in-process | step ms | wall s | start-up s"
    cells = ("{layout} | {workers} | {tokens_per_s:.0f} | {vs:.2f}x | {step_ms:.2f} | "
             "{seconds:.2f} | {startup_s:.1f}")  # fmt: skip
    base = rows[0]["tokens_per_s"]
    shown = [r | {"vs": r["tokens_per_s"] / base} for r in rows]
    Console().print(table_of(title, columns, cells, shown))


CPU_NOTE = (
    "CPU only: tp x pp workers are Ray CPU actors sharing this machine's cores; "
    "tensor parallelism all-reduces over gloo in float32 and pipeline activations "
    "pass through Ray's object store, so splitting a tiny model on CPU is slower "
    "than one process. These numbers show the distributed path's overhead, not "
    "GPU (NCCL) scaling."
)
GPU_NOTE = (
    "GPUs: each tp x pp worker is a Ray actor holding one GPU; tensor parallelism "
    "all-reduces over NCCL, pipeline activations pass through Ray's object store. "
    "step_ms is wall time / engine iterations of the best repeat."
)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cuda = args.device == "cuda"
    device = torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")
    result = {
        "benchmark": "parallel",
        "note": GPU_NOTE if cuda else CPU_NOTE,
        "model": args.model,
        "device": args.device,
        "workload": {
            "requests": args.requests,
            "prompt_tokens": args.prompt,
            "output_tokens": args.output,
            "max_batch_size": args.batch,
            "policy": "fcfs",
        },
        "machine": describe_machine(device),
        "results": [],
    }
    skip = gpu_skip_reason() if cuda else None
    if skip is None:
        from fsd.engine.ray_cluster import ensure_ray

        ray, _ = ensure_ray(None, num_cpus=max(4, os.cpu_count() or 1))
        # a tp=pp=1 engine runs on one Ray actor when given a cluster to join
        args.ray_address_for_1x1 = ray.get_runtime_context().gcs_address
        layouts = LAYOUTS
        if cuda:
            layouts = [x for x in GPU_LAYOUTS if x[0] * x[1] <= torch.cuda.device_count()]
        with tempfile.TemporaryDirectory() as tmp:
            profile = str(Path(tmp) / "fixed.json")  # no calibration: throughput is timed
            CostModel(name="bench-fixed").save(profile)
            result["results"] = [run(args.model, tp, pp, r, args, profile) for tp, pp, r in layouts]
        print_table(result["results"], args)
    else:
        result["skipped"] = skip
        print(f"bench/parallel.py --device cuda: skipped, {skip}; nothing measured")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
