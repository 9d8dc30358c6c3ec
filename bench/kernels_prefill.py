"""bench/kernels.py's prefill and store_kv sections.

prefill  ``SxQ+P``: S sequences of Q new tokens each after a cached prefix of P tokens
         (P = 0: whole prompts), K/V already in the paged cache. TFLOP/s counts the
         multiply-adds of causal attention over each query's visible keys (4 x heads x
         head_dim x visible pairs), the same count for fsd and the peer.
store    T tokens' K and V written to random slots of a paged cache; GB/s counts K/V
         read, cache written and the slots, against copy bandwidth and torch's indexed
         assignment (``store_kv_ref``, what the CPU engine runs).
"""

from __future__ import annotations

import attn_peers
import torch
from rich.console import Console
from rich.table import Table


def parse_case(spec: str) -> tuple[int, int, int]:
    """'4x512+2048' -> (4 sequences, 512 new tokens each, 2048 cached before them)."""
    seqs, rest = spec.split("x")
    q_len, prefix = rest.split("+") if "+" in rest else (rest, "0")
    return int(seqs), int(q_len), int(prefix)


def prefill_row(spec: str, heads, args, device, timer, peers: list[str]) -> dict:
    from fsd.kernels import paged_prefill

    if device.type == "cuda":
        torch.cuda.empty_cache()  # the last row's tensors are gone: give their memory back
    seqs, q_len, prefix = parse_case(spec)
    ctx, q_lens = [prefix + q_len] * seqs, [q_len] * seqs
    case = attn_peers.make_case(ctx, heads, args, device)
    dtype = case["q"].dtype
    case["q"] = torch.randn((seqs * q_len, heads[0], args.head_dim), dtype=dtype, device=device)
    case["ctx"], case["q_lens"] = ctx, q_lens
    qsl = torch.arange(0, seqs * q_len + 1, q_len, dtype=torch.int32, device=device)
    scale = args.head_dim**-0.5
    call = (case["q"], case["k_cache"], case["v_cache"], case["tables"], case["lens"], qsl, scale)
    out = paged_prefill(*call, max_query_len=q_len)
    ms = timer(lambda: paged_prefill(*call, max_query_len=q_len))
    peer = attn_peers.time_peers(attn_peers.prefill_peer, peers, case, scale, out, timer)
    flops = attn_peers.prefill_flops(q_lens, ctx, heads[0], args.head_dim)
    name, peer_ms = attn_peers.best_peer(peer)
    return {
        "case": spec,
        "num_heads": heads[0],
        "num_kv_heads": heads[1],
        "seqs": seqs,
        "query_len": q_len,
        "cached_prefix": prefix,
        "flops": flops,
        "paged_ms": ms,
        "tflops": flops / (ms * 1e-3) / 1e12,
        "peers": peer,
        "best_peer": name,
        "best_peer_ms": peer_ms,
        "peer_tflops": flops / (peer_ms * 1e-3) / 1e12 if peer_ms else None,
        "speedup_vs_best_peer": peer_ms / ms if peer_ms else None,
    }


def run_prefill(args, heads_list, device, timer, result: dict, console: Console) -> None:
    peers = result["peers"]["prefill"]
    elem = torch.empty((), dtype=attn_peers.DTYPES[args.dtype]).element_size()
    for heads in heads_list:
        for spec in (s.strip() for s in args.prefill.split(",") if s.strip()):
            seqs, q_len, prefix = parse_case(spec)
            size = attn_peers.kv_case_bytes(
                [prefix + q_len] * seqs, args.block_size, heads[1], args.head_dim, elem
            )
            label = f"prefill {heads[0]}/{heads[1]} {spec}"
            if size > args.max_gib * 2**30:
                result["skipped"].append({"case": label, "why": f"{size / 2**30:.1f} GiB of K/V"})
                continue
            row = prefill_row(spec, heads, args, device, timer, peers)
            result["prefill"].append(row)
            print(f"{label}: {row['tflops']:.1f} TFLOP/s", flush=True)
    table = Table(title=f"paged prefill, {args.dtype}, head_dim {args.head_dim}")
    for col in ("heads q/kv", "case", "prefix", "paged us", "TFLOP/s", "best peer", "peer us",
                "peer TFLOP/s", "x peer", "max |diff|"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in result["prefill"]:
        peer = r["peers"].get(r["best_peer"] or "", {})
        timed = r["best_peer_ms"] is not None
        table.add_row(
            f"{r['num_heads']}/{r['num_kv_heads']}",
            f"{r['seqs']}x{r['query_len']}",
            str(r["cached_prefix"]),
            f"{1e3 * r['paged_ms']:.1f}",
            f"{r['tflops']:.1f}",
            r["best_peer"] or "-",
            f"{1e3 * r['best_peer_ms']:.1f}" if timed else "-",
            f"{r['peer_tflops']:.1f}" if timed else "-",
            f"{r['speedup_vs_best_peer']:.2f}" if timed else "-",
            f"{peer['max_abs_diff']:.1e}" if "max_abs_diff" in peer else "-",
        )
    console.print(table)
    print_peer_errors(console, result["prefill"])


def store_row(tokens: int, num_kv_heads: int, args, device, timer, copy_gbps: float) -> dict:
    from fsd.kernels import reference, store_kv

    dtype, bs = attn_peers.DTYPES[args.dtype], args.block_size
    blocks = -(-2 * tokens // bs)  # the cache half full after the store
    shape = (blocks, bs, num_kv_heads, args.head_dim)
    k_cache = torch.zeros(shape, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn((tokens, num_kv_heads, args.head_dim), dtype=dtype, device=device)
    value = torch.randn_like(key)
    slots = torch.randperm(blocks * bs, device=device)[:tokens]
    ms = timer(lambda: store_kv(key, value, k_cache, v_cache, slots))
    torch_ms = timer(lambda: reference.store_kv_ref(key, value, k_cache, v_cache, slots))
    moved = 4 * key.numel() * key.element_size() + 8 * tokens
    gbps = attn_peers.gbps(moved, ms)
    return {
        "tokens": tokens,
        "num_kv_heads": num_kv_heads,
        "bytes": moved,
        "ms": ms,
        "gbps": gbps,
        "fraction_of_copy": gbps / copy_gbps,
        "torch_ms": torch_ms,
        "speedup_vs_torch": torch_ms / ms,
    }


def run_store(args, heads_list, device, timer, result: dict, console: Console) -> None:
    copy_gbps = result["copy"]["gbps"]
    for kv_heads in sorted({h[1] for h in heads_list}):
        for tokens in (int(t) for t in args.store_tokens.split(",") if t.strip()):
            row = store_row(tokens, kv_heads, args, device, timer, copy_gbps)
            result["store_kv"].append(row)
    table = Table(
        title=f"store_kv, {args.dtype}, head_dim {args.head_dim}, block {args.block_size}"
    )
    for col in ("kv heads", "tokens", "us", "GB/s", "% copy", "torch us", "x torch"):
        table.add_column(col, justify="right")
    for r in result["store_kv"]:
        table.add_row(
            str(r["num_kv_heads"]),
            str(r["tokens"]),
            f"{1e3 * r['ms']:.1f}",
            f"{r['gbps']:.0f}",
            f"{100 * r['fraction_of_copy']:.1f}",
            f"{1e3 * r['torch_ms']:.1f}",
            f"{r['speedup_vs_torch']:.2f}",
        )
    console.print(table)


def print_peer_errors(console: Console, rows: list[dict]) -> None:
    seen = set()
    for r in rows:
        for name, p in r["peers"].items():
            if "error" in p and (name, p["error"]) not in seen:
                seen.add((name, p["error"]))
                console.print(f"peer {name} failed: {p['error']}")
