"""The KV swap path on a GPU: its bandwidth, and what it costs a decode step it overlaps.

    .venv/bin/python bench/swap.py                 # on a CUDA machine (OPT-1.3B shape, fp16)
    .venv/bin/python bench/swap.py --cpu-smoke     # tiny run on the CPU (copy thread), no GPU

bandwidth  fsd's real swap path (fsd/engine/swapper.py over the pools of
           fsd/engine/kv_cache.py: an index_select gather of the blocks on the device,
           then one pinned copy per run of adjacent host blocks out; pinned copies into
           a staging buffer, then an index_copy scatter in) moving N random blocks of
           every layer, run both ways it runs in the engine: `run_sync` (reactive
           swapping, at once on the compute stream) and `start` + `wait` (proactive:
           bounded slices on the side stream, fsd/engine/swap_staging.py). Against one contiguous
           pinned copy of the same bytes (the PCIe / C2C ceiling). GB/s count the bytes
           moved once.
overlap    the paper's Fig. 9: the model's decode step (batch B at context C, built
           and sampled the way the worker does it, timed on the host) alone, then while
           a proactive swap of about `--overlap-steps` steps' worth of other blocks runs
           on the side stream, out and in. Per direction: the step alone, the step
           during the copy (inflation = median during / median alone; target <= 1.15),
           the copy alone (proactive, no step beside it), the overlapped total (copy
           start to its end with steps running), and what the same swap costs a step
           when reactive (run_sync before the step). On a GPU every row is run twice:
           with the copier's bounded slices ("staged", what the engine does) and with
           each swap moved as one slice ("whole"), to show what the staging buys.

On CPU the swapper copies on one background thread instead of a stream, so --cpu-smoke
runs the same code on the tiny preset (its figures say nothing about a GPU); without
--cpu-smoke and without CUDA it says so and exits 0. Writes JSON (default
bench/results/swap-<gpu-name>.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine, machine_slug  # noqa: E402

from fsd.config import ModelConfig  # noqa: E402
from fsd.engine.kv_cache import KVCachePool, KVShape  # noqa: E402
from fsd.engine.swapper import HostKVPool, Swapper  # noqa: E402
from fsd.kv.swap import SwapOp  # noqa: E402
from fsd.layers.attention import AttentionMetadata  # noqa: E402
from fsd.models.loader import load_model  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="opt-1.3b", help="preset or checkpoint directory")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--blocks", type=int, default=512, help="blocks per bandwidth copy")
    p.add_argument("--batch", type=int, default=16, help="decode batch of the overlap run")
    p.add_argument("--context", type=int, default=512, help="context of each decoding job")
    p.add_argument("--steps", type=int, default=15, help="decode steps timed alone")
    p.add_argument("--overlap-steps", type=int, default=8, help="a swap lasts about this many")
    p.add_argument("--max-swap-blocks", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3, help="bandwidth runs (best kept)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny run on the CPU")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.model, args.dtype, args.blocks, args.batch, args.context = "tiny", "float32", 8, 2, 40
        args.steps, args.overlap_steps, args.max_swap_blocks, args.repeats = 3, 2, 16, 1
    return args


def sync(device: torch.device) -> None:
    """Wait for the compute stream only: a swap on the side stream runs on."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


# ----------------------------------------------------------------------------- bandwidth


def timed(fn, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def pinned_copy(nbytes: int, device: torch.device, repeats: int) -> dict[str, float]:
    """GB/s of one contiguous copy each way between pinned host memory and the device."""
    pin = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = min(timed(lambda: host.copy_(dev, non_blocking=True), device) for _ in range(repeats))
    into = min(timed(lambda: dev.copy_(host, non_blocking=True), device) for _ in range(repeats))
    return {"out": nbytes / out / 1e9, "in": nbytes / into / 1e9}


def swap_ops(direction: str, src: list[int], dst: list[int]) -> list[SwapOp]:
    return [SwapOp(job=None, direction=direction, src=list(src), dst=list(dst))]


def swap_seconds(swapper: Swapper, ops: list[SwapOp], mode: str, device) -> float:
    """One swap, reactive (run_sync) or proactive (start, then wait for its end)."""
    if mode == "sync":
        return timed(lambda: swapper.run_sync(ops), device)
    sync(device)
    start = time.perf_counter()
    swapper.start(ops)
    while swapper.busy:
        swapper.wait(timeout=1.0)
    return time.perf_counter() - start


def bandwidth(swapper: Swapper, args, device, rng: random.Random) -> list[dict]:
    """fsd's swap, each direction and mode, against a contiguous pinned copy."""
    dev_blocks, host_blocks = swapper.device_pool.num_blocks, swapper.host_pool.num_blocks
    n = min(args.blocks, dev_blocks, host_blocks)
    nbytes = n * swapper.host_pool.bytes_per_block
    ceiling = pinned_copy(nbytes, device, args.repeats)
    rows = []
    for direction in ("out", "in"):
        for mode in ("sync", "async"):
            best = float("inf")
            for _ in range(args.repeats):
                dev = rng.sample(range(dev_blocks), n)
                host = rng.sample(range(host_blocks), n)
                src, dst = (dev, host) if direction == "out" else (host, dev)
                best = min(best, swap_seconds(swapper, swap_ops(direction, src, dst), mode, device))
            gbps = nbytes / best / 1e9
            rows.append({"direction": direction, "mode": mode, "blocks": n, "bytes": nbytes,
                         "ms": 1e3 * best, "gbps": gbps, "pinned_gbps": ceiling[direction],
                         "fraction_of_pinned": gbps / ceiling[direction]})  # fmt: skip
    return rows


# ----------------------------------------------------------------------------- overlap


class DecodeBatch:
    """B jobs at context C in the pool's first blocks; `step()` is one engine decode step."""

    def __init__(self, lm, pool: KVCachePool, batch: int, context: int) -> None:
        self.lm, self.pool, self.device = lm, pool, pool.data.device
        per = -(-(context + 1) // pool.block_size)
        self.tables = [list(range(b * per, (b + 1) * per)) for b in range(batch)]
        self.used = batch * per
        self.context = [context] * batch
        self.ids = [(7 * b) % 200 + 3 for b in range(batch)]

    @torch.inference_mode()
    def step(self) -> list[int]:
        """Metadata and ids uploaded, the forward, the head, greedy tokens back on the host
        (the worker's path; the context stays put so every step costs the same)."""
        dev, n = self.device, len(self.ids)
        meta = AttentionMetadata.build([1] * n, self.context, self.tables, self.pool.block_size,
                                       device=dev)  # fmt: skip
        ids = torch.tensor(self.ids, dtype=torch.long, device=dev)
        pos = torch.tensor([c - 1 for c in self.context], dtype=torch.long, device=dev)
        hidden = self.lm.model(ids, pos, self.pool.layers, meta)
        return self.lm.model.compute_logits(hidden).argmax(-1).tolist()


def step_times(batch: DecodeBatch, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        batch.step()
        out.append(time.perf_counter() - start)
    return out


def overlap(swapper: Swapper, batch: DecodeBatch, args, rng, bw: dict[str, float]) -> list[dict]:
    """Decode steps while a proactive swap of other jobs' blocks runs beside them."""
    alone = statistics.median(step_times(batch, args.steps))
    per_block = swapper.host_pool.bytes_per_block
    free = range(batch.used, swapper.device_pool.num_blocks)
    rows = []
    for direction, layout in itertools.product(("out", "in"), ("scattered", "adjacent")):
        want = args.overlap_steps * alone * bw[direction] * 1e9 / per_block
        n = int(max(4, min(want, args.max_swap_blocks, len(free), swapper.host_pool.num_blocks)))
        dev = rng.sample(free, n)
        # host blocks at random (the worst case: a copy per block) or adjacent, as the
        # host pool's free list hands them out (the swapper copies a run at once)
        host = rng.sample(range(swapper.host_pool.num_blocks), n)
        if layout == "adjacent":
            first = rng.randrange(swapper.host_pool.num_blocks - n + 1)
            host = list(range(first, first + n))
        ops = swap_ops(direction, *((dev, host) if direction == "out" else (host, dev)))
        sync(batch.device)
        start = time.perf_counter()
        swapper.start(ops)
        during = []
        while swapper.busy or not during:
            during += step_times(batch, 1)
            swapper.poll()
        total = time.perf_counter() - start
        alone_copy = swap_seconds(swapper, ops, "async", batch.device)
        reactive = swap_seconds(swapper, ops, "sync", batch.device)
        after = statistics.median(step_times(batch, max(3, args.steps // 3)))
        mid = statistics.median(during)
        rows.append({"direction": direction, "host_blocks": layout, "blocks": n,
                     "bytes": n * per_block,
                     "step_alone_ms": 1e3 * alone, "step_during_swap_ms": 1e3 * mid,
                     "step_after_ms": 1e3 * after, "inflation": mid / alone,
                     "steps_during_swap": len(during), "overlapped_ms": 1e3 * total,
                     "copy_alone_ms": 1e3 * alone_copy,
                     "reactive_swap_ms": 1e3 * reactive,
                     "reactive_step_ms": 1e3 * (alone + reactive)})  # fmt: skip
    return rows


# ----------------------------------------------------------------------------- main


def build(args, device: torch.device):
    """The model, the device pool (decode batch + room to swap) and the pinned host pool."""
    lm = load_model(ModelConfig(model=args.model, device=device.type, dtype=args.dtype))
    arch = lm.arch
    shape = KVShape(arch.num_layers, arch.kv_heads_per_rank(1), arch.head_dim, lm.dtype)
    per_job = -(-(args.context + 1) // args.block_size)
    num = args.batch * per_job + max(args.blocks, args.max_swap_blocks)
    pool = KVCachePool(shape, num, args.block_size, device)
    host = HostKVPool(shape, max(args.blocks, args.max_swap_blocks), args.block_size,
                      pin=device.type == "cuda")  # fmt: skip
    return lm, pool, Swapper(pool, host)


def print_tables(console: Console, result: dict) -> None:
    t = Table(title=f"KV swap bandwidth, {result['model']} blocks of {result['block_bytes']} B")
    for col in ("direction", "mode", "blocks", "ms", "GB/s", "pinned GB/s", "% pinned"):
        t.add_column(col, justify="right")
    for r in result["bandwidth"]:
        t.add_row(r["direction"], r["mode"], str(r["blocks"]), f"{r['ms']:.2f}",
                  f"{r['gbps']:.1f}", f"{r['pinned_gbps']:.1f}",
                  f"{100 * r['fraction_of_pinned']:.0f}")  # fmt: skip
    console.print(t)
    t = Table(title=f"decode step (batch {result['batch']}, ctx {result['context']}) during a swap")
    for col in ("swap", "slices", "host blocks", "blocks", "alone ms", "during ms", "inflation",
                "steps during", "copy alone ms", "overlapped ms", "reactive step ms"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in result["overlap"]:
        t.add_row(r["direction"], r.get("slice", "-"), r.get("host_blocks", "scattered"), str(r["blocks"]),
                  f"{r['step_alone_ms']:.2f}",
                  f"{r['step_during_swap_ms']:.2f}", f"x{r['inflation']:.2f}",
                  str(r["steps_during_swap"]), f"{r.get('copy_alone_ms', float('nan')):.1f}",
                  f"{r['overlapped_ms']:.1f}",
                  f"{r['reactive_step_ms']:.2f}")  # fmt: skip
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=160)
    if not args.cpu_smoke and not torch.cuda.is_available():
        console.print("bench/swap.py measures host <-> GPU KV copies and needs a CUDA device; "
                      "none found, nothing measured. --cpu-smoke runs a tiny CPU version.")  # fmt: skip
        return 0
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    rng = random.Random(0)
    lm, pool, swapper = build(args, device)
    block_bytes = swapper.host_pool.bytes_per_block  # (close() lets go of the pools)
    try:
        batch = DecodeBatch(lm, pool, args.batch, args.context)
        batch.step()  # warm up (kernels compile)
        bw = bandwidth(swapper, args, device, rng)
        best = {d: max(r["gbps"] for r in bw if r["direction"] == d) for d in ("out", "in")}
        lapped = [{**r, "slice": "staged"} for r in overlap(swapper, batch, args, rng, best)]
        if not args.cpu_smoke:  # the same swaps moved as one slice: what the staging buys
            whole = Swapper(pool, swapper.host_pool, slice_bytes=block_bytes * args.max_swap_blocks)
            try:
                lapped += [{**r, "slice": "whole"} for r in overlap(whole, batch, args, rng, best)]
            finally:
                whole.close()
    finally:
        swapper.close()
    result = {"benchmark": "swap", "machine": describe_machine(device), "model": args.model,
              "dtype": str(lm.dtype).removeprefix("torch."), "block_size": args.block_size,
              "block_bytes": block_bytes, "batch": args.batch,
              "context": args.context, "cpu_smoke": args.cpu_smoke, "bandwidth": bw,
              "overlap": lapped}  # fmt: skip
    print_tables(console, result)
    path = args.json
    if path is None and not args.cpu_smoke:
        path = Path(__file__).resolve().parent / "results" / f"swap-{machine_slug(device)}.json"
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
