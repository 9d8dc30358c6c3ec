"""What a step costs besides the model: the batch layout and the engine around the forward.

    .venv/bin/python bench/step_overhead.py            # CPU, 1 thread
    .venv/bin/python bench/step_overhead.py --batches 1,32 --steps 64

Two tables. `AttentionMetadata.build`: the median time to lay out a batch of B
decodes at context --context (block size 16), and of the same decodes beside one
prefill of --context tokens. The step: the `tiny` preset decoding B jobs, each step
timed (median) whole (`Engine.step`) and in parts: the model's forward
(`forward_stage` and the head, `compute_logits`), the rest of `Worker.launch` (layout,
input tensors, sampling) and the rest of the engine (scheduler, plan, appending
tokens). "not forward" is the host work a GPU step would have to hide; "host alone"
times whole steps again with the forward and the head returning their last output
at once (sampling still runs), the host's work without the CPU forward sweeping its
caches, as on a GPU. "ahead" times whole steps of a second engine that schedules one
step ahead (fsd.engine.ahead; on a CPU the model runs on a thread of its own): the
host's work hidden behind the forward, the step near max(forward, host). Writes
bench/results/step-overhead-<device>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine, machine_slug, table_of, timing_args, write_json  # noqa: E402

from fsd import LLM, SamplingParams  # noqa: E402
from fsd.layers.attention import AttentionMetadata  # noqa: E402

BLOCK = 16


def time_build(batch: int, context: int, prefill: int, reps: int) -> float:
    """Median seconds of one build: `batch` decodes (+ one prefill of `prefill` tokens)."""
    nb = -(-context // BLOCK)
    q = [1] * batch + ([prefill] if prefill else [])
    c = [context] * batch + ([prefill] if prefill else [])
    tables = [tuple(range(i * nb, (i + 1) * nb)) for i in range(len(q))]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        AttentionMetadata.build(q, c, tables, BLOCK)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Timer:
    """Wraps a bound method; keeps each call's seconds."""

    def __init__(self, obj, name: str) -> None:
        self.fn = getattr(obj, name)
        self.times: list[float] = []
        setattr(obj, name, self)

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.times.append(time.perf_counter() - start)


def decoding(batch: int, args, ahead: bool) -> tuple[LLM, list]:
    """An engine whose `batch` jobs all decode (prefills are spread over steps, so
    jobs start apart: room for every timing)."""
    llm = LLM(
        "tiny",
        device=args.device,
        num_gpu_blocks=8192,
        num_host_blocks=0,
        max_batch_size=batch,
        profile="opt-13b-h100",  # a shipped cost model: no calibration at start
        schedule_ahead=ahead,
    )
    eng = llm.engine
    llm.generate([1, 2, 3], SamplingParams(max_tokens=4))  # warm up
    params = SamplingParams(max_tokens=3 * args.steps + 64, ignore_eos=True)
    jobs = [
        eng.add_request([(7 * i + k) % 200 + 1 for k in range(args.context)], params)
        for i in range(batch)
    ]
    while not all(j.output_token_ids for j in jobs):
        eng.step()  # until every job decodes
    return llm, jobs


def whole_steps(eng, steps: int, batch: int) -> list[float]:
    total = []
    for _ in range(steps):
        start = time.perf_counter()
        eng.step()
        total.append(time.perf_counter() - start)
        assert eng.last_iteration.batch_size == batch, "a timed step was not the whole batch"
    return total


def time_steps(batch: int, args) -> dict:
    llm, _ = decoding(batch, args, ahead=False)
    eng = llm.engine
    worker = eng.executor.worker
    step_t = Timer(worker, "launch")
    fwd_t = Timer(worker.model, "forward_stage")
    head_t = Timer(worker.model, "compute_logits")  # the model's too (inside the graph on a GPU)
    total = whole_steps(eng, args.steps, batch)
    med = statistics.median
    whole, wstep = med(total), med(step_t.times)
    fwd = med([a + b for a, b in zip(fwd_t.times, head_t.times, strict=True)])
    alone = host_alone(eng, worker, args.steps)
    llm.close()
    llm, _ = decoding(batch, args, ahead=True)
    ahead = med(whole_steps(llm.engine, args.steps, batch))
    llm.close()
    return {
        "batch": batch,
        "step_ms": 1e3 * whole,
        "forward_ms": 1e3 * fwd,
        "worker_rest_ms": 1e3 * (wstep - fwd),
        "engine_rest_ms": 1e3 * (whole - wstep),
        "overhead_share": (whole - fwd) / whole,
        "host_alone_ms": 1e3 * alone,
        "ahead_ms": 1e3 * ahead,
    }


def host_alone(eng, worker, steps: int) -> float:
    """Median seconds of a step whose forward and head return their last output at once
    (same shapes): the host's work alone, with caches the forward has not swept."""
    model = worker.model
    forward, head, kept = model.forward_stage, model.compute_logits, {}

    def cached(fn, key):
        def call(x, *args, **kwargs):
            if (key, x.shape[0]) not in kept:
                kept[key, x.shape[0]] = fn(x, *args, **kwargs)
            return kept[key, x.shape[0]]

        return call

    model.forward_stage, model.compute_logits = cached(forward, "f"), cached(head, "h")
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - start)
    model.forward_stage, model.compute_logits = forward, head
    assert len(kept) == 2, "the batch changed during the host-alone steps"
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--device", default="cpu")
    args = timing_args(ap, batches="1,8,32,128")
    console = Console()
    batches = args.batches

    builds = []
    for b in batches:
        builds.append(
            {
                "batch": b,
                "decode_us": 1e6 * time_build(b, args.context, 0, args.reps),
                "with_prefill_us": 1e6 * time_build(b, args.context, args.context, args.reps),
            }
        )
    title = f"AttentionMetadata.build, context {args.context}: us (median)"
    columns = f"decodes | decodes only | + prefill of {args.context}"
    cells = "{batch} | {decode_us:.1f} | {with_prefill_us:.1f}"
    console.print(table_of(title, columns, cells, builds))

    steps = [time_steps(b, args) for b in batches]
    title = f"tiny decode step at context {args.context}, {args.threads} thread(s): ms (median)"
    columns = "batch | step | forward | worker rest | engine rest | not forward | host alone | ahead"
    cells = ("{batch} | {step_ms:.2f} | {forward_ms:.2f} | {worker_rest_ms:.2f} | "
             "{engine_rest_ms:.2f} | {overhead_share:.0%} | {host_alone_ms:.3f} | {ahead_ms:.2f}")  # fmt: skip
    console.print(table_of(title, columns, cells, steps))
    dev = torch.device(args.device)
    result = {
        "bench": "step overhead",
        "machine": describe_machine(dev),
        "settings": {k: getattr(args, k) for k in ("context", "steps", "reps", "threads")},
        "build": builds,
        "steps": steps,
    }
    out = write_json(args.json or f"bench/results/step-overhead-{machine_slug(dev)}.json", result)
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
