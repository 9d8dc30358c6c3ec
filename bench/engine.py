"""Engine throughput: decode tokens/s by batch size, prefill tokens/s, and on a GPU the
decode step of OPT-1.3B against its weight-read roofline.

    .venv/bin/python bench/engine.py                 # CPU, tiny preset
    .venv/bin/python bench/engine.py --gpu-model opt-1.3b   # on a CUDA machine

Prints a table and writes JSON (default bench/results/engine-<device>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine, machine_slug  # noqa: E402

from fsd import LLM, SamplingParams  # noqa: E402


def decode_rate(llm: LLM, batch: int, prompt_len: int, steps: int) -> dict:
    """Decode tokens/s once every job of the batch is past its prefill."""
    eng = llm.engine
    params = SamplingParams(max_tokens=steps + 1, ignore_eos=True)
    for i in range(batch):
        eng.add_request([(7 * i + k) % 200 + 1 for k in range(prompt_len)], params)
    eng.step()  # the prefill of every job
    _sync(eng.device)
    start = time.perf_counter()
    tokens = 0
    n = 0
    while eng.has_unfinished():
        tokens += len(eng.step())
        n += 1
    _sync(eng.device)
    elapsed = time.perf_counter() - start
    return {
        "batch": batch,
        "context": prompt_len + steps,
        "tokens_per_s": tokens / elapsed,
        "step_ms": 1e3 * elapsed / max(n, 1),
    }


def prefill_rate(llm: LLM, batch: int, prompt_len: int, repeats: int) -> dict:
    eng = llm.engine
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    elapsed = 0.0
    for r in range(repeats):
        for i in range(batch):
            eng.add_request([(3 * i + k + r) % 200 + 1 for k in range(prompt_len)], params)
        _sync(eng.device)
        start = time.perf_counter()
        eng.step()
        _sync(eng.device)
        elapsed += time.perf_counter() - start
    return {
        "batch": batch,
        "prompt_len": prompt_len,
        "tokens_per_s": batch * prompt_len * repeats / elapsed,
        "step_ms": 1e3 * elapsed / repeats,
    }


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy GB/s, counting the read and the write."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    _sync(device)
    reps = 10
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    _sync(device)
    return 2 * nbytes * reps / (time.perf_counter() - start) / 1e9


def roofline(llm: LLM, context: int, steps: int) -> dict:
    """Batch-1 decode step against the time to read every weight once."""
    eng = llm.engine
    weight_bytes = eng.loaded.weight_bytes
    bw = copy_bandwidth(eng.device)
    res = decode_rate(llm, 1, context, steps)
    bound_ms = 1e3 * weight_bytes / (bw * 1e9)
    return {
        "weight_bytes": weight_bytes,
        "copy_gb_s": bw,
        "roofline_step_ms": bound_ms,
        "step_ms": res["step_ms"],
        "fraction_of_roofline": bound_ms / res["step_ms"],
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--gpu-model", default="opt-1.3b", help="model for the roofline (CUDA only)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    console = Console()
    llm = LLM(args.model, device=args.device, num_gpu_blocks=2048, max_batch_size=64)
    dev = llm.engine.device
    llm.generate([1, 2, 3], SamplingParams(max_tokens=4))  # warm up
    decode = [
        decode_rate(llm, b, args.prompt_len, args.steps) for b in map(int, args.batches.split(","))
    ]
    prefill = [prefill_rate(llm, b, n, 3) for b, n in ((1, 512), (4, 256))]

    table = Table(title=f"fsd engine, {args.model} on {dev.type}")
    for col in ("phase", "batch", "tokens", "tokens/s", "step ms"):
        table.add_column(col, justify="right")
    for r in decode:
        table.add_row(
            "decode",
            str(r["batch"]),
            f"ctx {r['context']}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['step_ms']:.2f}",
        )
    for r in prefill:
        table.add_row(
            "prefill",
            str(r["batch"]),
            f"len {r['prompt_len']}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['step_ms']:.2f}",
        )
    console.print(table)

    result = {
        "machine": describe_machine(dev),
        "model": args.model,
        "decode": decode,
        "prefill": prefill,
    }
    if dev.type == "cuda":
        del llm
        torch.cuda.empty_cache()
        big = LLM(args.gpu_model, dtype="float16", max_batch_size=8)
        big.generate([1, 2, 3], SamplingParams(max_tokens=4))
        rl = roofline(big, 128, 64)
        result["roofline"] = {"model": args.gpu_model, **rl}
        console.print(
            f"{args.gpu_model} fp16 batch-1 decode step {rl['step_ms']:.2f} ms; weight-read "
            f"roofline {rl['roofline_step_ms']:.2f} ms at {rl['copy_gb_s']:.0f} GB/s copy "
            f"({100 * rl['fraction_of_roofline']:.0f}% of roofline)"
        )
    out = Path(args.json or f"bench/results/engine-{machine_slug(dev)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    main()
