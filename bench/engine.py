"""Engine throughput: decode tokens/s by batch size, prefill tokens/s, and on a GPU the
decode step of OPT-1.3B against its weight-read roofline.

    .venv/bin/python bench/engine.py                 # CPU, tiny preset
    .venv/bin/python bench/engine.py --gpu-model opt-1.3b   # on a CUDA machine
    .venv/bin/python bench/engine.py --chunk-inflation      # chunked prefill (P10)

Prints a table and writes JSON (default bench/results/engine-<device>.json).

--chunk-inflation: N decoding jobs (fcfs) step alone, then a long prompt (2040 tokens:
the tiny preset's context is 2048) joins them; the steps that carry its prefill are
timed, chunked (256, 512) or whole (chunking off; max_batch_tokens >= prompt + N), and
the table gives each against the step alone (medians). Writes
bench/results/engine-chunks-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


# ---- a decode step's inflation while a long prompt is prefilled (chunked prefill) ----


def _timed_step(eng) -> tuple[float, int, int]:
    """One step: (seconds, prefill tokens it carried, decodes it carried)."""
    _sync(eng.device)
    start = time.perf_counter()
    eng.step()
    _sync(eng.device)
    it = eng.last_iteration
    return time.perf_counter() - start, it.prefill_tokens, it.decode_tokens


def step_inflation(args, chunk: int) -> dict:
    """N decoding jobs: their step alone, then the steps that carry a long prompt's
    prefill (its chunks, or the whole of it with chunk 0), each over `--repeats` prompts."""
    n, long = args.decodes, args.long_prompt
    llm = LLM(
        args.model,
        device=args.device,
        num_gpu_blocks=4096,
        max_batch_size=n + 1,
        max_batch_tokens=max(4096, long + n),  # chunking off: the whole prompt in one step
        prefill_chunk=chunk,
        policy="fcfs",  # the decodes first, then the prompt: every step carries all of them
        profile=args.profile,  # a shipped cost model: no calibration (fcfs hardly reads it)
    )
    eng = llm.engine
    prompt = [(3 * k) % 200 + 1 for k in range(long)]
    llm.generate(prompt, SamplingParams(max_tokens=1, ignore_eos=True))  # warm up
    steps = -(-long // chunk) if chunk else 1  # steps that carry one prompt's prefill
    budget = args.alone_steps + args.repeats * (steps + 4) + 16
    decode = SamplingParams(max_tokens=budget, ignore_eos=True)
    for i in range(n):
        eng.add_request([(7 * i + k) % 200 + 1 for k in range(args.prompt_len)], decode)
    while True:  # until every decoding job is past its prefill
        _, prefill, decodes = _timed_step(eng)
        if not prefill and decodes == n:
            break
    alone = [_timed_step(eng)[0] for _ in range(args.alone_steps)]
    carrying, tokens = [], []
    for _ in range(args.repeats):
        job = eng.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
        while not job.status.finished:
            dt, prefill, decodes = _timed_step(eng)
            if prefill:
                carrying.append(dt)
                tokens.append(prefill)
                assert decodes == n, f"a step carried {decodes} decodes, not {n}"
        alone += [_timed_step(eng)[0] for _ in range(2)]  # between prompts
    device = str(eng.device)
    llm.close()
    step, with_prefill = statistics.median(alone), statistics.median(carrying)
    return {
        "device": device,
        "prefill_chunk": chunk,
        "decodes": n,
        "long_prompt": long,
        "step_alone_ms": 1e3 * step,
        "step_with_prefill_ms": 1e3 * with_prefill,
        "max_step_with_prefill_ms": 1e3 * max(carrying),
        "ratio": with_prefill / step,
        "steps_with_prefill": len(carrying),
        "prefill_tokens_per_step": sorted(set(tokens)),
        "alone_ms": [1e3 * t for t in alone],
        "with_prefill_ms": [1e3 * t for t in carrying],
    }


def chunk_inflation(args) -> None:
    console = Console()
    # one thread: OpenMP threads that spin on cores other processes hold make a step 10-100x
    # slower at random (measured here: 5 ms or 550 ms for the same decode step)
    torch.set_num_threads(args.threads)
    chunks = [int(c) for c in args.chunks.split(",")]
    rows = [step_inflation(args, c) for c in chunks]
    table = Table(
        title=f"{args.decodes} decodes with a {args.long_prompt}-token prompt, {args.model} "
        f"on {rows[0]['device']} ({args.threads} thread): step ms (median)"
    )
    for col in ("prefill", "step alone", "step carrying it", "ratio", "max", "steps"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"chunk {r['prefill_chunk']}" if r["prefill_chunk"] else "whole",
            f"{r['step_alone_ms']:.1f}",
            f"{r['step_with_prefill_ms']:.1f}",
            f"{r['ratio']:.2f}",
            f"{r['max_step_with_prefill_ms']:.1f}",
            str(r["steps_with_prefill"]),
        )
    console.print(table)
    dev = torch.device(rows[0].pop("device"))
    result = {
        "bench": "engine chunk inflation",
        "machine": describe_machine(dev),
        "model": args.model,
        "policy": "fcfs",
        "settings": {k: getattr(args, k) for k in ("decodes", "prompt_len", "long_prompt",
                                                   "alone_steps", "repeats", "profile", "threads")},
        "runs": rows,
    }  # fmt: skip
    out = Path(args.json or f"bench/results/engine-chunks-{machine_slug(dev)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--gpu-model", default="opt-1.3b", help="model for the roofline (CUDA only)")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--chunk-inflation",
        action="store_true",
        help="time the decode step while a long prompt is prefilled, by chunk size\n"
        "(writes bench/results/engine-chunks-<device>.json)",
    )
    ap.add_argument("--chunks", default="0,256,512", help="prefill chunk sizes (0: whole)")
    ap.add_argument("--decodes", type=int, default=16, help="decoding jobs")
    ap.add_argument("--long-prompt", type=int, default=2040, help="the prompt prefilled")
    ap.add_argument("--alone-steps", type=int, default=12, help="decode-only steps timed")
    ap.add_argument("--repeats", type=int, default=3, help="long prompts per chunk size")
    ap.add_argument("--profile", default="opt-13b-h100", help="cost model (no calibration)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (--chunk-inflation)")
    args = ap.parse_args()
    if args.chunk_inflation:
        chunk_inflation(args)
        return

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
    phases = (("decode", decode, "ctx {context}"), ("prefill", prefill, "len {prompt_len}"))
    for phase, rows, tokens in phases:
        for r in rows:
            rate, step = f"{r['tokens_per_s']:.0f}", f"{r['step_ms']:.2f}"
            table.add_row(phase, str(r["batch"]), tokens.format(**r), rate, step)
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
