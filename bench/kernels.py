"""Paged decode attention on a GPU: achieved bandwidth against a device copy and torch SDPA.

    .venv/bin/python bench/kernels.py                 # on a CUDA machine
    .venv/bin/python bench/kernels.py --sweep         # also try tile / warp / stage / split configs
    .venv/bin/python bench/kernels.py --cpu-smoke     # tiny run in Triton's interpreter, no GPU

For each (heads, batch, context) the Triton ``paged_decode`` reads K and V through
shuffled block tables; its GB/s counts the bytes of K + V + q + out (+ tables). The
ceiling is the measured ``dst.copy_(src)`` bandwidth of a few GB (read + write bytes).
SDPA runs on the same K/V stored densely as [B, H, ctx, D] (``enable_gqa`` when the
heads are grouped). Goals: paged decode >= 85% of copy bandwidth at batch >= 16 and
context >= 2048, and no slower than SDPA.

Prints a table and writes JSON (default bench/results/kernels-<gpu-name>.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine, machine_slug  # noqa: E402

BW_GOAL = 0.85  # fraction of copy bandwidth
BW_GOAL_MIN_BATCH = 16
BW_GOAL_MIN_CONTEXT = 2048
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", default="16,64", help="comma-separated batch sizes")
    p.add_argument("--contexts", default="512,2048,8192", help="comma-separated context lengths")
    p.add_argument("--heads", default="32/8,32/32", help="query/kv head pairs, comma-separated")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    p.add_argument("--copy-gib", type=float, default=2.0, help="size of each copy buffer")
    p.add_argument("--rep-ms", type=int, default=200, help="do_bench repetition time")
    p.add_argument("--sweep", action="store_true", help="also search launch configs per row")
    p.add_argument("--json", type=Path, default=None, help="result file")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny interpreter run on the CPU")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- timing


def make_timer(device: torch.device, rep_ms: int) -> Callable[[Callable[[], object]], float]:
    """Milliseconds per call: triton's do_bench (L2 flushed) on CUDA, a plain loop on CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        def cuda_time(fn: Callable[[], object], rep: int = rep_ms) -> float:
            return float(do_bench(fn, warmup=max(10, rep // 4), rep=rep, return_mode="median"))

        return cuda_time

    def cpu_time(fn: Callable[[], object], rep: int = rep_ms) -> float:
        fn()
        times = []
        deadline = time.perf_counter() + rep / 1e3
        while not times or (time.perf_counter() < deadline and len(times) < 5):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e3 * sorted(times)[len(times) // 2]

    return cpu_time


def copy_bandwidth(device: torch.device, gib: float, timer) -> dict:
    """GB/s of a large device-to-device copy, counting bytes read plus bytes written."""
    numel = int(gib * 2**30) // 2
    src = torch.ones(numel, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    moved = 2 * src.numel() * src.element_size()
    return {"bytes": moved, "ms": ms, "gbps": moved / (ms * 1e-3) / 1e9}


# ----------------------------------------------------------------------------- one case


def make_case(
    batch: int,
    context: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> dict:
    """A paged cache holding ``batch`` sequences of ``context`` tokens in shuffled blocks."""
    gen = torch.Generator(device=device).manual_seed(batch * 100003 + context)
    per_seq = math.ceil(context / block_size)
    num_blocks = batch * per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, dtype=dtype, device=device)
    v_cache = torch.randn(shape, generator=gen, dtype=dtype, device=device)
    order = torch.randperm(num_blocks, generator=gen, device=device)
    tables = order.view(batch, per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn((batch, num_heads, head_dim), generator=gen, dtype=dtype, device=device)
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "tables": tables, "lens": lens}


def dense_kv(cache: torch.Tensor, tables: torch.Tensor, context: int) -> torch.Tensor:
    """[B, Hkv, ctx, D] contiguous copy of the paged cache, for SDPA."""
    batch, per_seq = tables.shape
    blocks = cache[tables.long()]  # [B, per_seq, bs, Hkv, D]
    flat = blocks.view(batch, per_seq * cache.shape[1], *cache.shape[2:])[:, :context]
    return flat.permute(0, 2, 1, 3).contiguous()


def decode_bytes(case: dict, context: int) -> int:
    """Bytes paged decode must move: K + V of every context token, q, out, the tables."""
    q, k_cache = case["q"], case["k_cache"]
    batch, _, head_dim = q.shape
    kv = 2 * batch * context * k_cache.shape[2] * head_dim * k_cache.element_size()
    return kv + 2 * q.numel() * q.element_size() + case["tables"].numel() * 4 + batch * 4


def sdpa_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """SDPA over dense [B, H, ctx, D] K/V; native GQA when torch has it, else repeated heads."""
    q4 = q.unsqueeze(2)  # [B, Hq, 1, D]
    grouped = q.shape[1] != k.shape[1]
    if grouped:
        try:
            F.scaled_dot_product_attention(q4[:1], k[:1], v[:1], scale=scale, enable_gqa=True)
        except TypeError:  # torch < 2.5
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            mode = "repeat_kv"
        else:
            mode = "enable_gqa"
            return (
                lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)
            ), mode
    else:
        mode = "mha"
    return (lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale)), mode


def sweep_configs(default_splits: int) -> list[dict]:
    splits = sorted({max(1, default_splits // 2), default_splits, default_splits * 2})
    return [
        {"block_n": bn, "num_warps": w, "num_stages": st, "num_splits": sp}
        for bn in (32, 64, 128)
        for w in (4, 8)
        for st in (2, 3)
        for sp in splits
    ]


def time_paged(case: dict, scale: float, timer, moved: int, sweep: list[dict], rep_ms: int):
    """Output, ms per call and (when sweeping) the fastest launch config of paged_decode."""
    from fsd.kernels import paged_decode

    q, kc, vc, tables, lens = (case[k] for k in ("q", "k_cache", "v_cache", "tables", "lens"))
    out = paged_decode(q, kc, vc, tables, lens, scale)
    ms = timer(lambda: paged_decode(q, kc, vc, tables, lens, scale))
    best = None
    for cfg in sweep:
        try:
            cfg_ms = timer(
                lambda cfg=cfg: paged_decode(q, kc, vc, tables, lens, scale, **cfg),
                max(20, rep_ms // 8),
            )
        except Exception:  # e.g. triton's OutOfResources: too much shared memory
            continue
        if best is None or cfg_ms < best["ms"]:
            best = {**cfg, "ms": cfg_ms, "gbps": moved / (cfg_ms * 1e-3) / 1e9}
    return out, ms, best


def time_sdpa(case: dict, context: int, scale: float, timer):
    """Output, ms per call and GQA mode of SDPA on a dense copy; frees the paged cache first."""
    kd = dense_kv(case.pop("k_cache"), case["tables"], context)
    vd = dense_kv(case.pop("v_cache"), case["tables"], context)
    fn, mode = sdpa_fn(case["q"], kd, vd, scale)
    ref = fn().squeeze(2)
    return ref, timer(fn), mode


def run_row(
    args: argparse.Namespace,
    heads: tuple[int, int],
    batch: int,
    context: int,
    device: torch.device,
    timer,
    copy_gbps: float,
) -> dict:
    """Time paged decode and SDPA for one shape; return the row (see the table columns)."""
    from fsd.kernels.launch import choose_num_splits, num_sms_of

    num_heads, num_kv_heads = heads
    dtype = DTYPES[args.dtype]
    scale = args.head_dim**-0.5
    case = make_case(
        batch, context, num_heads, num_kv_heads, args.head_dim, args.block_size, dtype, device
    )
    moved = decode_bytes(case, context)
    splits = choose_num_splits(
        batch, num_kv_heads, case["tables"].shape[1] * args.block_size, num_sms_of(device)
    )
    sweep = sweep_configs(splits) if args.sweep else []
    out, paged_ms, best = time_paged(case, scale, timer, moved, sweep, args.rep_ms)
    ref, sdpa_ms, sdpa_mode = time_sdpa(case, context, scale, timer)
    max_diff = float((out.float() - ref.float()).abs().max())
    del case, out, ref
    if device.type == "cuda":
        torch.cuda.empty_cache()

    paged_gbps = moved / (paged_ms * 1e-3) / 1e9
    bw_applies = batch >= BW_GOAL_MIN_BATCH and context >= BW_GOAL_MIN_CONTEXT
    return {
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "batch": batch,
        "context": context,
        "num_splits": splits,
        "bytes": moved,
        "paged_ms": paged_ms,
        "paged_gbps": paged_gbps,
        "fraction_of_copy": paged_gbps / copy_gbps,
        "sdpa_ms": sdpa_ms,
        "sdpa_gbps": moved / (sdpa_ms * 1e-3) / 1e9,
        "sdpa_mode": sdpa_mode,
        "speedup_vs_sdpa": sdpa_ms / paged_ms,
        "max_abs_diff_vs_sdpa": max_diff,
        "bw_goal": (paged_gbps / copy_gbps >= BW_GOAL) if bw_applies else None,
        "sdpa_goal": paged_ms <= sdpa_ms,
        "sweep_best": best,
    }


# ----------------------------------------------------------------------------- report


def _mark(ok: bool | None) -> str:
    if ok is None:
        return "[dim]-[/dim]"
    return "[green]yes[/green]" if ok else "[red]no[/red]"


def print_table(console: Console, rows: list[dict], copy: dict, title: str) -> None:
    table = Table(title=title)
    for col in (
        "heads q/kv",
        "batch",
        "ctx",
        "splits",
        "paged us",
        "paged GB/s",
        "% copy",
        "SDPA us",
        "SDPA GB/s",
        "x SDPA",
        "max |diff|",
        ">=85% copy",
        ">= SDPA",
    ):
        table.add_column(col, justify="right")
    sweeping = any(r["sweep_best"] for r in rows)
    if sweeping:
        table.add_column("sweep best", justify="right")
    for r in rows:
        best = r["sweep_best"]
        best_txt = (
            f"{best['gbps']:.0f} GB/s n{best['block_n']} w{best['num_warps']} "
            f"s{best['num_stages']} k{best['num_splits']}"
            if best
            else ""
        )
        cells = [
            f"{r['num_heads']}/{r['num_kv_heads']}",
            str(r["batch"]),
            str(r["context"]),
            str(r["num_splits"]),
            f"{1e3 * r['paged_ms']:.1f}",
            f"{r['paged_gbps']:.0f}",
            f"{100 * r['fraction_of_copy']:.1f}",
            f"{1e3 * r['sdpa_ms']:.1f}",
            f"{r['sdpa_gbps']:.0f}",
            f"{r['speedup_vs_sdpa']:.2f}",
            f"{r['max_abs_diff_vs_sdpa']:.1e}",
            _mark(r["bw_goal"]),
            _mark(r["sdpa_goal"]),
        ]
        table.add_row(*cells, *([best_txt] if sweeping else []))
    console.print(table)
    console.print(
        f"device copy: {copy['gbps']:.0f} GB/s ({copy['bytes'] / 1e9:.1f} GB moved in "
        f"{copy['ms']:.2f} ms); goals: paged decode >= {100 * BW_GOAL:.0f}% of copy at batch "
        f">= {BW_GOAL_MIN_BATCH} and ctx >= {BW_GOAL_MIN_CONTEXT}, and >= SDPA speed"
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _heads(text: str) -> list[tuple[int, int]]:
    pairs = []
    for item in text.split(","):
        hq, hkv = item.split("/")
        pairs.append((int(hq), int(hkv)))
    return pairs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=200)
    if args.cpu_smoke:
        # The kernels import Triton on first call; interpreter mode must be set before that.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = torch.device("cpu")
        args.batches, args.contexts, args.heads = "2", "33,100", "4/2"
        args.head_dim, args.dtype, args.copy_gib, args.rep_ms = 32, "fp32", 0.0625, 50
        args.sweep = False
    elif not torch.cuda.is_available():
        console.print(
            "bench/kernels.py measures GPU bandwidth and needs a CUDA device; none found. "
            "Run with --cpu-smoke for a tiny interpreter check."
        )
        return 0
    else:
        device = torch.device("cuda")

    timer = make_timer(device, args.rep_ms)
    copy = copy_bandwidth(device, args.copy_gib, timer)
    rows = []
    for heads in _heads(args.heads):
        for batch in _ints(args.batches):
            for context in _ints(args.contexts):
                row = run_row(args, heads, batch, context, device, timer, copy["gbps"])
                rows.append(row)
                console.print(
                    f"heads {heads[0]}/{heads[1]} batch {batch} ctx {context}: "
                    f"{row['paged_gbps']:.0f} GB/s ({100 * row['fraction_of_copy']:.0f}% of copy), "
                    f"{row['speedup_vs_sdpa']:.2f}x SDPA"
                )

    machine = describe_machine(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        machine["sm_count"] = props.multi_processor_count
        machine["cuda"] = torch.version.cuda
    else:
        import triton

        machine["triton"] = triton.__version__
    title = f"paged decode, {args.dtype}, head_dim {args.head_dim}, block {args.block_size}"
    title += f" on {machine.get('gpu', 'cpu (interpreter smoke run)')}"
    print_table(console, rows, copy, title)

    result = {
        "benchmark": "paged_decode",
        "machine": machine,
        "config": {
            "dtype": args.dtype,
            "head_dim": args.head_dim,
            "block_size": args.block_size,
            "copy_gib": args.copy_gib,
            "rep_ms": args.rep_ms,
            "sweep": args.sweep,
            "cpu_smoke": args.cpu_smoke,
        },
        "goals": {
            "fraction_of_copy": BW_GOAL,
            "min_batch": BW_GOAL_MIN_BATCH,
            "min_context": BW_GOAL_MIN_CONTEXT,
            "at_least_sdpa_speed": True,
        },
        "copy": copy,
        "rows": rows,
    }
    path = args.json
    if path is None and not args.cpu_smoke:
        path = Path(__file__).resolve().parent / "results" / f"kernels-{machine_slug(device)}.json"
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
