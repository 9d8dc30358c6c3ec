"""The decode step against its physical limit, and where its time goes.

    .venv/bin/python bench/engine_gpu.py                  # on a GPU: opt-1.3b and llama-1b
    .venv/bin/python bench/engine_gpu.py --models llama-1b --batches 1,32 --steps 64
    .venv/bin/python bench/engine_gpu.py --device cpu --models tiny --steps 8   # a smoke run

For each model (random weights, fp16 on a GPU) and batch B at context C: the median
decode step (`Engine.step` wall time; every CUDA graph bucket is captured when the
engine starts, so no capture or compile is timed), its roofline (every weight read
once plus the batch's KV read once, at the measured device-to-device copy bandwidth)
and its breakdown: the GPU span (CUDA events from the start of `Worker.launch` to the
end of the head, which a replayed graph runs), the host's enqueue time
(`Worker.launch` entered to the draw given the logits: launches and staging, never a
wait on the GPU) and the host time the GPU does not hide (step minus GPU span); and
the kernels one eager step launches per layer (torch.profiler; the graph replays as
many). Steps are scheduled one step ahead (the default on a GPU, fsd.engine.ahead);
a row "in step" per model at batch 1 schedules each step after the last one's tokens,
to show what scheduling ahead hides. Targets: batch 1 <= 1.5x its roofline, batch 32
<= 2x. Writes bench/results/engine-gpu-<device>.json.
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

from machine import describe_machine, machine_slug, table_of, write_json  # noqa: E402

from fsd import LLM, SamplingParams  # noqa: E402

TARGET = {1: 1.5, 32: 2.0}  # step / roofline at that batch


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device copy GB/s, counting the read and the write (the roofline's bandwidth)."""
    if device.type != "cuda":
        nbytes = 64 << 20
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Breakdown:
    """Wraps the worker's step and the model's head: per step, the host time until the
    head returned and (on CUDA) the events around the GPU's part."""

    def __init__(self, worker, cuda: bool) -> None:
        self.cuda = cuda
        self.enqueue: list[float] = []
        self.events: list[tuple] = []
        self._began = 0.0
        self._first = None
        step, head = worker.launch, worker._draw

        def timed_step(*args, **kwargs):
            self._began = time.perf_counter()
            self._first = self._event()
            return step(*args, **kwargs)

        def timed_head(*args, **kwargs):  # the logits are enqueued: the draw reads them
            self.enqueue.append(time.perf_counter() - self._began)
            self.events.append((self._first, self._event()))
            return head(*args, **kwargs)

        worker.launch, worker._draw = timed_step, timed_head

    def _event(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def gpu_ms(self) -> list[float]:
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in self.events]


def kernels_per_layer(eng, layers: int) -> float:
    """Kernels one eager decode step launches, per layer (the graph replays as many)."""
    from torch.profiler import ProfilerActivity, profile

    worker = eng.executor.worker
    graphs, worker.graphs = worker.graphs, None
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            eng.step()
            torch.cuda.synchronize()
    finally:
        worker.graphs = graphs
    launched = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(launched) / layers


def measure(model: str, batch: int, args, bw: float, ahead: bool = True) -> dict:
    kw = {"dtype": "float16"} if args.device == "cuda" else {}
    llm = LLM(model, device=args.device, max_batch_size=max(batch, 1), num_gpu_blocks=args.blocks,
              profile="opt-13b-h100", schedule_ahead=ahead, **kw)  # fmt: skip
    eng = llm.engine
    worker = eng.executor.worker
    params = SamplingParams(max_tokens=args.steps + 8, ignore_eos=True)
    for i in range(batch):
        eng.add_request([(7 * i + k) % 200 + 1 for k in range(args.context)], params)
    while eng.last_iteration is None or eng.last_iteration.prefill_tokens or eng.iterations < 3:
        eng.step()  # past every prefill, and a few decodes (allocator, caches)
    parts = Breakdown(worker, args.device == "cuda")
    walls = []
    for _ in range(args.steps):
        _sync(eng.device)
        start = time.perf_counter()
        eng.step()
        walls.append(time.perf_counter() - start)
    arch, itemsize = eng.loaded.arch, eng.loaded.dtype.itemsize
    per_layer = kernels_per_layer(eng, arch.num_layers) if parts.cuda else float("nan")
    kv_per_token = 2 * arch.num_layers * arch.kv_heads_per_rank(1) * arch.head_dim * itemsize
    read = eng.loaded.weight_bytes + batch * (args.context + args.steps // 2) * kv_per_token
    gpu = statistics.median(parts.gpu_ms()) if parts.cuda else float("nan")
    step = 1e3 * statistics.median(walls)
    roof = 1e3 * read / (bw * 1e9)
    llm.close()
    return {
        "model": model, "batch": batch, "scheduled": "ahead" if ahead else "in step",
        "context": args.context, "step_ms": step,
        "roofline_ms": roof, "x_roofline": step / roof, "target_x": TARGET.get(batch),
        "gpu_span_ms": gpu, "enqueue_ms": 1e3 * statistics.median(parts.enqueue),
        "host_not_hidden_ms": step - gpu if parts.cuda else float("nan"),
        "tokens_per_s": batch / (step / 1e3), "weight_bytes": eng.loaded.weight_bytes,
        "kernels_per_layer": per_layer,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="opt-1.3b,llama-1b")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--blocks", type=int, default=4096, help="device KV blocks")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    console = Console(width=160)
    device = torch.device(args.device)
    bw = copy_bandwidth(device)
    rows = []
    for m in args.models.split(","):
        batches = list(map(int, args.batches.split(",")))
        rows += [measure(m, b, args, bw) for b in batches]
        rows.append(measure(m, batches[0], args, bw, ahead=False))
    title = f"decode step against its roofline ({bw:.0f} GB/s copy), context {args.context}: ms (median)"
    columns = (
        "model | batch | scheduled | step | roofline | x roofline | target | GPU span | enqueue | host not hidden | "
        "tokens/s | kernels/layer"
    )
    cells = ("{model} | {batch} | {scheduled} | {step_ms:.3f} | {roofline_ms:.3f} | {x_roofline:.2f} | {target_x} | "
             "{gpu_span_ms:.3f} | {enqueue_ms:.3f} | {host_not_hidden_ms:.3f} | {tokens_per_s:.0f} | "
             "{kernels_per_layer:.1f}")  # fmt: skip
    console.print(table_of(title, columns, cells, rows, left=1))
    result = {"bench": "engine-gpu", "machine": describe_machine(device), "copy_gb_s": bw,
              "settings": {"context": args.context, "steps": args.steps}, "rows": rows}  # fmt: skip
    out = write_json(args.json or f"bench/results/engine-gpu-{machine_slug(device)}.json", result)
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
