"""fsd's Triton kernels on a GPU, each against its limit and the strongest installed peer.

    .venv/bin/python bench/kernels.py                 # on a CUDA machine (full grid)
    .venv/bin/python bench/kernels.py --quick         # the grid scripts/gpu-check.sh runs
    .venv/bin/python bench/kernels.py --sweep         # also try tile / warp / stage / split configs
    .venv/bin/python bench/kernels.py --cpu-smoke     # tiny run in Triton's interpreter, no GPU

Timing: on a GPU each call is captured as a CUDA graph and its replays timed with
events, L2 flushed before each, so a figure is the device's work; the host's launch
time of an eager call is reported apart ("launch us").

decode   paged decode GB/s (bytes of K + V + q + out + tables) against the measured
         ``dst.copy_(src)`` bandwidth (read + write bytes), at batch 1-64 and context
         512-32k in shuffled block tables: uniform, ragged (lengths 1/8 .. 15/8 of the
         mean) and ramped (rising evenly to a longest) batches, each mixed one beside its
         uniform twin of the same bytes. Goals: >= 85% of copy at batch >= 16 and context
         >= 2048, no slower than the best peer, a mixed batch <= 1.1x its twin.
prefill  paged prefill TFLOP/s (causal, cached prefix or none) against the peer's
         varlen prefill over contiguous K/V.
store    store_kv GB/s (K/V read + cache written + slots) against copy bandwidth and
         torch's indexed assignment (the reference the CPU engine runs).

Peers (bench/attn_peers.py): FlashAttention 2/3 and FlashInfer when installed, else
torch SDPA; a peer that is not installed is named with why. A case whose paged K/V
would exceed --max-gib is skipped and listed. Prints tables and writes JSON (default
bench/results/kernels-<gpu-name>.json), rewritten after every section.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attn_peers  # noqa: E402
import kernels_prefill  # noqa: E402
from machine import describe_machine, machine_slug  # noqa: E402

BW_GOAL = 0.85  # fraction of copy bandwidth
BW_GOAL_MIN_BATCH = 16
BW_GOAL_MIN_CONTEXT = 2048
DTYPES = attn_peers.DTYPES
QUICK = {"batches": "1,16,64", "contexts": "512,2048,8192,32768", "ragged": "16x2048,64x8192",
         "ramps": "16x2048", "prefill": "1x4096+0,4x1024+0,4x512+4096,16x128+2048",
         "store_tokens": "64,4096,65536", "rep_ms": 100}  # fmt: skip
SMOKE = {"batches": "2", "contexts": "33", "ragged": "2x33", "ramps": "", "heads": "4/2",
         "head_dim": 32, "dtype": "fp32", "copy_gib": 0.0625, "rep_ms": 20,
         "prefill": "2x16+0,1x8+24", "store_tokens": "16", "sweep": False, "max_gib": 1.0}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", default="1,4,16,64", help="comma-separated batch sizes")
    p.add_argument("--contexts", default="512,2048,8192,32768", help="context lengths")
    p.add_argument("--ragged", default="16x2048,64x2048,16x8192,64x8192",
                   help="ragged batches BxMEAN (lengths 1/8 .. 15/8 of the mean)")  # fmt: skip
    p.add_argument("--ramps", default="16x2048,64x8192", help="ramped batches BxMAX (MAX/B .. MAX)")
    p.add_argument("--heads", default="32/8,32/32", help="query/kv head pairs, comma-separated")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    p.add_argument("--prefill", default="1x8192+0,4x2048+0,8x512+0,4x512+4096,16x256+2048",
                   help="prefill cases SEQSxQUERY+CACHED_PREFIX")  # fmt: skip
    p.add_argument("--store-tokens", default="64,4096,65536", help="store_kv batch sizes")
    p.add_argument("--sections", default="decode,prefill,store", help="which to run")
    p.add_argument("--max-gib", type=float, default=12.0, help="skip cases with more paged K/V")
    p.add_argument("--copy-gib", type=float, default=2.0, help="size of each copy buffer")
    p.add_argument("--rep-ms", type=int, default=200, help="do_bench repetition time")
    p.add_argument("--sweep", action="store_true", help="also search decode launch configs")
    p.add_argument("--json", type=Path, default=None, help="result file")
    p.add_argument("--quick", action="store_true", help="the smaller grid of gpu-check.sh")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny interpreter run on the CPU")
    args = p.parse_args(argv)
    for key, value in (SMOKE if args.cpu_smoke else QUICK if args.quick else {}).items():
        setattr(args, key, value)
    return args


# ----------------------------------------------------------------------------- timing


def make_timer(device: torch.device, rep_ms: int) -> Callable[..., float]:
    """Milliseconds per call of the device's work alone: on CUDA the call is captured
    once as a CUDA graph and replayed, each replay after a 256 MB write that flushes
    L2, timed by events around the replay only (no host launch in the figure; a call
    that cannot be captured falls back to triton's do_bench); a plain loop on CPU."""
    if device.type == "cuda":
        flush = torch.empty(256 << 20, dtype=torch.int8, device=device)

        def cuda_time(fn: Callable[[], object], rep: int = rep_ms) -> float:
            try:
                return _graph_ms(fn, flush, rep)
            except Exception:  # noqa: BLE001 - not capturable: time it eagerly
                from triton.testing import do_bench

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


def _graph_ms(fn: Callable[[], object], flush: torch.Tensor, rep_ms: int) -> float:
    """Median ms of one replay of `fn` captured as a CUDA graph, L2 flushed before each."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and settle outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    began = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    once = max(time.perf_counter() - began, 1e-6)
    n = int(max(5, min(1000, rep_ms / 1e3 / once)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for start, end in events:
        flush.zero_()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in events)
    return times[len(times) // 2]


def launch_ms(fn: Callable[[], object], device: torch.device, reps: int = 20) -> float:
    """Median host milliseconds to call `fn` eagerly (the launch, with its argument
    building and allocations; the GPU is idle before each call)."""
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def copy_bandwidth(device: torch.device, gib: float, timer) -> dict:
    """GB/s of a large device-to-device copy, counting bytes read plus bytes written."""
    numel = int(gib * 2**30) // 2
    src = torch.ones(numel, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    moved = 2 * src.numel() * src.element_size()
    return {"bytes": moved, "ms": ms, "gbps": moved / (ms * 1e-3) / 1e9}


# ----------------------------------------------------------------------------- decode


def decode_bytes(case: dict) -> int:
    """Bytes paged decode must move: K + V of every context token, q, out, the tables."""
    q, k_cache = case["q"], case["k_cache"]
    tokens = int(case["lens"].sum())
    kv = 2 * tokens * k_cache.shape[2] * k_cache.shape[3] * k_cache.element_size()
    return kv + 2 * q.numel() * q.element_size() + case["tables"].numel() * 4 + q.shape[0] * 4


def sweep_configs(default_splits: int) -> list[dict]:
    splits = sorted({max(1, default_splits // 2), default_splits, default_splits * 2})
    return [{"block_n": bn, "num_warps": w, "num_stages": st, "num_splits": sp, "use_dot": dot}
            for bn in (32, 64, 128) for w in (4, 8) for st in (2, 3) for sp in splits
            for dot in (False, True)]  # fmt: skip


def sweep_best(case: dict, scale: float, timer, moved: int, splits: int, rep_ms: int) -> dict:
    from fsd.kernels import paged_decode

    args = (case["q"], case["k_cache"], case["v_cache"], case["tables"], case["lens"], scale)
    best: dict = {}
    for cfg in sweep_configs(splits):
        kw = {**cfg, "max_context": int(case["lens"].max())}
        try:
            ms = timer(lambda kw=kw: paged_decode(*args, **kw), max(20, rep_ms // 8))
        except Exception:  # e.g. triton's OutOfResources: too much shared memory
            continue
        if not best or ms < best["ms"]:
            best = {**cfg, "ms": ms, "gbps": attn_peers.gbps(moved, ms)}
    return best


def decode_row(lens: list[int], heads, args, device, timer, copy_gbps: float, peers) -> dict:
    """Time paged decode and each peer on one batch; the row the table and JSON show."""
    from fsd.kernels import launch, paged_decode

    if device.type == "cuda":
        torch.cuda.empty_cache()  # the last row's tensors are gone: give their memory back
    scale = args.head_dim**-0.5
    case = attn_peers.make_case(lens, heads, args, device)
    moved = decode_bytes(case)
    block_n = launch.attention_constants(case["q"], case["k_cache"], None)["BLOCK_N"]
    chunk, splits = launch.decode_chunking(len(lens), heads[1], max(lens), block_n, launch.num_sms_of(device))
    call = (case["q"], case["k_cache"], case["v_cache"], case["tables"], case["lens"], scale)
    run = functools.partial(paged_decode, *call, max_context=max(lens))  # as a step knows it
    out = run()
    paged_ms, host_ms = timer(run), launch_ms(run, device)
    best = sweep_best(case, scale, timer, moved, splits, args.rep_ms) if args.sweep else None
    peer = attn_peers.time_peers(attn_peers.decode_peer, peers, case, scale, out, timer)
    name, peer_ms = attn_peers.best_peer(peer)
    mean = round(sum(lens) / len(lens))
    applies = len(lens) >= BW_GOAL_MIN_BATCH and mean >= BW_GOAL_MIN_CONTEXT
    fraction = attn_peers.gbps(moved, paged_ms) / copy_gbps
    return {"num_heads": heads[0], "num_kv_heads": heads[1], "batch": len(lens), "context": mean,
            "max_context": max(lens), "ragged": len(set(lens)) > 1, "num_splits": splits,
            "chunk": chunk, "use_dot": launch.decode_group_tile(heads[0] // heads[1])[0],
            "bytes": moved, "paged_ms": paged_ms, "paged_gbps": attn_peers.gbps(moved, paged_ms),
            "launch_ms": host_ms, "fraction_of_copy": fraction, "peers": peer, "best_peer": name,
            "best_peer_ms": peer_ms, "speedup_vs_best_peer": peer_ms / paged_ms if peer_ms else None,
            "bw_goal": fraction >= BW_GOAL if applies else None,
            "peer_goal": (paged_ms <= peer_ms) if applies and peer_ms else None,
            "sweep_best": best}  # fmt: skip


def ramp_lens(batch: int, longest: int) -> list[int]:
    """`batch` lengths rising evenly to `longest` (longest/B, 2 longest/B .. longest), mixed."""
    lens = [max(1, round(longest * (i + 1) / batch)) for i in range(batch)]
    return lens[::2] + lens[1::2]


def decode_cases(args) -> list[tuple[tuple[int, int], list[int]]]:
    """Uniform batches, then each ragged and ramped one after its twin of the same bytes."""
    mixed = [attn_peers.ragged_lens(*s) for s in _pairs(args.ragged, "x")]
    mixed += [ramp_lens(*s) for s in _pairs(args.ramps, "x")]
    cases = []
    for heads in _pairs(args.heads):
        cases += [(heads, [c] * b) for b in _ints(args.batches) for c in _ints(args.contexts)]
        for lens in mixed:
            twin = [round(sum(lens) / len(lens))] * len(lens)
            cases += [(heads, x) for x in (twin, lens) if (heads, x) not in cases]
    return cases


def ragged_pairs(rows: list[dict]) -> list[dict]:
    """Each mixed row against its uniform twin (heads, batch, mean context): time ratio."""
    uniform = {(r["num_heads"], r["num_kv_heads"], r["batch"], r["context"]): r for r in rows if not r["ragged"]}
    pairs = []
    for r in (r for r in rows if r["ragged"]):
        u = uniform.get((r["num_heads"], r["num_kv_heads"], r["batch"], r["context"]))
        if u is not None:
            case = f"{r['num_heads']}/{r['num_kv_heads']} b{r['batch']} ctx~{r['context']} (max {r['max_context']})"
            pairs.append({"case": case, "ragged_ms": r["paged_ms"], "uniform_ms": u["paged_ms"],
                          "ratio": r["paged_ms"] / u["paged_ms"]})  # fmt: skip
    return pairs


def run_decode(args, device, timer, copy: dict, peers: list[str], result: dict) -> None:
    elem = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    for heads, lens in decode_cases(args):
        size = attn_peers.kv_case_bytes(lens, args.block_size, heads[1], args.head_dim, elem)
        label = f"decode {heads[0]}/{heads[1]} b{len(lens)} ctx{round(sum(lens) / len(lens))}"
        if size > args.max_gib * 2**30:
            result["skipped"].append({"case": label, "why": f"{size / 2**30:.1f} GiB of K/V"})
            continue
        row = decode_row(lens, heads, args, device, timer, copy["gbps"], peers)
        result["decode"].append(row)
        vs = f", {row['speedup_vs_best_peer']:.2f}x {row['best_peer']}" if row["best_peer"] else ""
        print(f"{label}: {row['paged_gbps']:.0f} GB/s "
              f"({100 * row['fraction_of_copy']:.0f}% of copy){vs}", flush=True)  # fmt: skip


# ----------------------------------------------------------------------------- report


MARKS = {None: "[dim]-[/dim]", True: "[green]yes[/green]", False: "[red]no[/red]"}


def print_decode(console: Console, rows: list[dict], copy: dict, title: str) -> None:
    table = Table(title=title)
    cols = ("heads q/kv", "batch", "ctx", "max", "splits x chunk", "paged us", "launch us", "GB/s", "% copy",
            "best peer", "peer us", "x peer", "max |diff|", ">=85% copy", ">= peer")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    if any(r["sweep_best"] for r in rows):
        table.add_column("sweep best", justify="right")
    for r in rows:
        peer = r["peers"].get(r["best_peer"] or "", {})
        b = r["sweep_best"]
        sweep = [f"{b['gbps']:.0f} GB/s n{b['block_n']} w{b['num_warps']} s{b['num_stages']} "
                 f"k{b['num_splits']} {'dot' if b['use_dot'] else 'rows'}"] if b else []  # fmt: skip
        table.add_row(
            f"{r['num_heads']}/{r['num_kv_heads']}", str(r["batch"]),
            ("~" if r["ragged"] else "") + str(r["context"]), str(r["max_context"]),
            f"{r['num_splits']}x{r['chunk']}" + ("" if r["use_dot"] else " rows"),
            f"{1e3 * r['paged_ms']:.1f}", f"{1e3 * r['launch_ms']:.1f}", f"{r['paged_gbps']:.0f}",
            f"{100 * r['fraction_of_copy']:.1f}", r["best_peer"] or "-",
            f"{1e3 * r['best_peer_ms']:.1f}" if r["best_peer_ms"] else "-",
            f"{r['speedup_vs_best_peer']:.2f}" if r["best_peer_ms"] else "-",
            f"{peer['max_abs_diff']:.1e}" if "max_abs_diff" in peer else "-",
            MARKS[r["bw_goal"]], MARKS[r["peer_goal"]], *sweep,
        )  # fmt: skip
    console.print(table)
    console.print(
        f"device copy: {copy['gbps']:.0f} GB/s ({copy['bytes'] / 1e9:.1f} GB moved in "
        f"{copy['ms']:.2f} ms); goals: paged decode >= {100 * BW_GOAL:.0f}% of copy at batch "
        f">= {BW_GOAL_MIN_BATCH} and ctx >= {BW_GOAL_MIN_CONTEXT}, and no slower than the peer"
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _pairs(text: str, sep: str = "/") -> list[tuple[int, int]]:  # "32/8,32/32", "16x2048"
    return [(int(a), int(b)) for a, b in (s.split(sep) for s in text.split(",") if s.strip())]


def save(result: dict, path: Path | None, console: Console) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {path}")


def setup(args) -> torch.device | None:
    if args.cpu_smoke:
        # The kernels import Triton on first call; interpreter mode must be set before that.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return torch.device("cpu")
    return torch.device("cuda") if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=200)
    device = setup(args)
    if device is None:
        console.print("bench/kernels.py measures GPU kernels and needs a CUDA device; none "
                      "found, nothing measured. --cpu-smoke runs a tiny interpreter check.")  # fmt: skip
        return 0
    machine = describe_machine(device)
    if device.type == "cuda":
        machine["sm_count"] = torch.cuda.get_device_properties(device).multi_processor_count
        machine["cuda"] = torch.version.cuda
    path = args.json
    if path is None and not args.cpu_smoke:
        path = Path(__file__).resolve().parent / "results" / f"kernels-{machine_slug(device)}.json"
    timer = make_timer(device, args.rep_ms)
    copy = copy_bandwidth(device, args.copy_gib, timer)
    status = attn_peers.peer_status()
    peers = attn_peers.choose_peers(status)
    console.print(f"peers: {', '.join(peers)}; " + "; ".join(f"{k}: {v}" for k, v in status.items()))
    where = machine.get("gpu", "cpu (interpreter smoke run)")
    keys = ("dtype", "head_dim", "block_size", "copy_gib", "rep_ms", "sweep", "quick", "cpu_smoke", "max_gib")
    result = {"benchmark": "kernels", "machine": machine,
              "config": {k: getattr(args, k) for k in keys},
              "goals": {"fraction_of_copy": BW_GOAL, "min_batch": BW_GOAL_MIN_BATCH,
                        "min_context": BW_GOAL_MIN_CONTEXT, "no_slower_than_peer": True},
              "peers": {"status": status, "decode": peers,
                        "prefill": attn_peers.choose_peers(status, prefill=True)},
              "copy": copy, "decode": [], "prefill": [], "store_kv": [], "skipped": []}  # fmt: skip
    sections = args.sections.split(",")
    if "decode" in sections:
        run_decode(args, device, timer, copy, peers, result)
        title = f"paged decode, {args.dtype}, head_dim {args.head_dim}, block {args.block_size}"
        result["ragged_vs_uniform"] = ragged_pairs(result["decode"])
        print_decode(console, result["decode"], copy, f"{title} on {where}")
        for pair in result["ragged_vs_uniform"]:
            console.print(f"ragged / uniform {pair['case']}: {pair['ratio']:.2f}x (goal <= 1.1x)")
        kernels_prefill.print_peer_errors(console, result["decode"])
        save(result, path, console)
    if "prefill" in sections:
        kernels_prefill.run_prefill(args, _pairs(args.heads), device, timer, result, console)
        save(result, path, console)
    if "store" in sections:
        kernels_prefill.run_store(args, _pairs(args.heads), device, timer, result, console)
        save(result, path, console)
    for skip in result["skipped"]:
        console.print(f"skipped {skip['case']}: {skip['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
