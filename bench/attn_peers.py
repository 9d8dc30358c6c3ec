"""The cases bench/kernels.py runs, and the attention peers it times fsd's kernels against.

Decode: FlashAttention's ``flash_attn_with_kvcache(block_table=...)`` (FlashAttention 2
wants pages of 256 tokens: the bench's block size is tried first, then 256),
FlashAttention 3's of the same name (module ``flash_attn_interface``), and FlashInfer's
``BatchDecodeWithPagedKVCacheWrapper`` on NHD pages (fsd's cache layout, used as it
is). Prefill: ``flash_attn_varlen_func`` over contiguous K/V (causal, aligned
bottom-right, so a cached prefix is the keys before the queries). When none of these
imports, torch SDPA is the peer: over a dense [B, Hkv, ctx, D] copy for decode (padded
and masked when the batch is ragged), one call per sequence for prefill.

Every peer reads the same K/V values as fsd's kernel; its own layout is built before
timing, and its output is compared with fsd's (``max_abs_diff``), so a peer that was
called wrongly shows up as a large difference instead of a flattering time.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# peer name -> module to import
PAGED_PEERS = {"flash_attn": "flash_attn", "flash_attn_3": "flash_attn_interface",
               "flashinfer": "flashinfer"}  # fmt: skip
PREFILL_PEERS = ("flash_attn", "flash_attn_3")
Fn = Callable[[], torch.Tensor]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def peer_status() -> dict[str, str]:
    """Each library peer: its version, or 'not installed: <why>'."""
    status = {}
    for name, module in PAGED_PEERS.items():
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # ImportError, or a build that does not load (OSError)
            status[name] = f"not installed: {type(exc).__name__}: {exc}"
        else:
            status[name] = str(getattr(mod, "__version__", "installed"))
    return status


def choose_peers(status: dict[str, str], prefill: bool = False) -> list[str]:
    """The installed peers (SDPA when there is none)."""
    names = PREFILL_PEERS if prefill else tuple(PAGED_PEERS)
    found = [n for n in names if not status.get(n, "not").startswith("not installed")]
    return found or ["sdpa"]


def _first(out: Any) -> torch.Tensor:
    """FlashAttention 3 may return (out, lse)."""
    return out[0] if isinstance(out, tuple | list) else out


def dense(cache: torch.Tensor, tables: torch.Tensor, length: int) -> torch.Tensor:
    """[B, length, Hkv, D]: the first `length` positions of each row's paged K or V."""
    block_size = cache.shape[1]
    nb = -(-length // block_size)
    blocks = cache[tables[:, :nb].long()]  # [B, nb, bs, Hkv, D]
    return blocks.flatten(1, 2)[:, :length]


# ----------------------------------------------------------------------------- cases


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def time_peers(build: Callable, names: list[str], case: dict, scale: float, ours, timer) -> dict:
    """{peer: {ms, note, max_abs_diff} or {error}} for each peer, on the same case."""
    out = {}
    for name in names:
        try:
            fn, note = build(name, case, scale)
            diff = float((fn().float() - ours.float()).abs().max())
            out[name] = {"ms": timer(fn), "note": note, "max_abs_diff": diff}
            del fn
        except Exception as exc:  # a peer that rejects the shape or its own install
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return out


def best_peer(peers: dict) -> tuple[str | None, float | None]:
    timed = {n: p["ms"] for n, p in peers.items() if "ms" in p}
    if not timed:
        return None, None
    name = min(timed, key=timed.__getitem__)
    return name, timed[name]


def make_case(lens: list[int], heads: tuple[int, int], args, device: torch.device) -> dict:
    """A paged cache holding sequences of `lens` tokens in shuffled blocks, and their q."""
    num_heads, num_kv_heads = heads
    bs, dtype = args.block_size, DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(len(lens) * 100003 + sum(lens))
    counts = [math.ceil(n / bs) for n in lens]
    shape = (sum(counts), bs, num_kv_heads, args.head_dim)
    k_cache = torch.randn(shape, generator=gen, dtype=dtype, device=device)
    v_cache = torch.randn(shape, generator=gen, dtype=dtype, device=device)
    order = torch.randperm(sum(counts), generator=gen, device=device).to(torch.int32)
    tables = torch.zeros((len(lens), max(counts)), dtype=torch.int32, device=device)
    used = 0
    for b, c in enumerate(counts):
        tables[b, :c] = order[used : used + c]
        used += c
    q = torch.randn((len(lens), num_heads, args.head_dim), generator=gen, dtype=dtype,
                    device=device)  # fmt: skip
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "tables": tables, "lens": lens_t,
            "block_size": bs}  # fmt: skip


def ragged_lens(batch: int, mean: int) -> list[int]:
    """`batch` lengths spread evenly over [mean/8, 15 mean/8] (their mean is `mean`), mixed."""
    if batch == 1:
        return [mean]
    lo, hi = max(1, mean // 8), 2 * mean - max(1, mean // 8)
    lens = [round(lo + (hi - lo) * i / (batch - 1)) for i in range(batch)]
    return lens[::2] + lens[1::2]


# ----------------------------------------------------------------------------- decode


def decode_peer(name: str, case: dict, scale: float) -> tuple[Fn, str]:
    """A call of peer `name` on the case's batch ([B, Hq, D] out) and a note on its layout."""
    build = {"flash_attn": _fa_decode, "flash_attn_3": _fa_decode, "flashinfer": _fi_decode,
             "sdpa": _sdpa_decode}[name]  # fmt: skip
    return build(name, case, scale)


def repage(case: dict, page: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The case's K/V in shuffled pages of `page` tokens: (k_cache, v_cache, tables)."""
    tables, lens = case["tables"], case["lens"]
    batch, longest = tables.shape[0], int(lens.max())
    nb = -(-longest // page)
    order = torch.randperm(batch * nb, device=tables.device)
    out = []
    for cache in (case["k_cache"], case["v_cache"]):
        flat = dense(cache, tables, longest)
        flat = F.pad(flat, (0, 0, 0, 0, 0, nb * page - longest))
        paged = torch.empty_like(flat).view(batch * nb, page, *flat.shape[2:])
        paged[order] = flat.reshape(batch * nb, page, *flat.shape[2:])
        out.append(paged)
        del flat
    return out[0], out[1], order.view(batch, nb).to(torch.int32)


def _fa_decode(name: str, case: dict, scale: float) -> tuple[Fn, str]:
    module = importlib.import_module(PAGED_PEERS[name])
    q = case["q"].unsqueeze(1)  # [B, 1, Hq, D]
    lens = case["lens"]
    table_kw = "page_table" if name == "flash_attn_3" else "block_table"  # FA3 renamed it
    for page in sorted({case["block_size"], 256}):
        if page == case["block_size"]:
            kc, vc, tables = case["k_cache"], case["v_cache"], case["tables"]
        else:
            kc, vc, tables = repage(case, page)

        def call(kc=kc, vc=vc, tables=tables) -> torch.Tensor:
            out = module.flash_attn_with_kvcache(
                q, kc, vc, cache_seqlens=lens, softmax_scale=scale, causal=True,
                **{table_kw: tables},
            )  # fmt: skip
            return _first(out).squeeze(1)

        try:
            call()
        except RuntimeError as exc:
            if page < 256 and "divisible" in str(exc):
                continue  # FlashAttention 2: pages of 256 tokens only
            raise
        return call, f"pages of {page}"
    raise RuntimeError("unreachable")


def _fi_decode(name: str, case: dict, scale: float) -> tuple[Fn, str]:
    import flashinfer

    q, kc, vc, tables, lens = (case[k] for k in ("q", "k_cache", "v_cache", "tables", "lens"))
    bs = case["block_size"]
    indptr, indices, last = flashinfer_pages(tables, lens, bs)
    dev = q.device
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    plan_args = (indptr, indices, last, q.shape[1], kc.shape[2], q.shape[2], bs)
    if hasattr(wrapper, "plan"):  # flashinfer >= 0.2
        wrapper.plan(*plan_args, pos_encoding_mode="NONE", q_data_type=q.dtype,
                     kv_data_type=kc.dtype, sm_scale=scale)  # fmt: skip
        return (lambda: wrapper.run(q, (kc, vc))), f"NHD pages of {bs}"
    wrapper.begin_forward(*plan_args, pos_encoding_mode="NONE", data_type=kc.dtype)
    return (lambda: wrapper.forward(q, (kc, vc), sm_scale=scale)), f"NHD pages of {bs} (0.1 API)"


def flashinfer_pages(tables: torch.Tensor, lens: torch.Tensor, block_size: int):
    """FlashInfer's CSR page list of a batch: (indptr [B+1], page ids, last page's fill)."""
    pages = [-(-n // block_size) for n in lens.tolist()]
    indptr = torch.tensor([0, *_cumsum(pages)], dtype=torch.int32, device=tables.device)
    indices = torch.cat([tables[b, :p] for b, p in enumerate(pages)]).to(torch.int32)
    last = [n - (p - 1) * block_size for n, p in zip(lens.tolist(), pages, strict=True)]
    return indptr, indices, torch.tensor(last, dtype=torch.int32, device=tables.device)


def _sdpa_decode(name: str, case: dict, scale: float) -> tuple[Fn, str]:
    q, lens = case["q"], case["lens"]
    longest = int(lens.max())
    k = dense(case["k_cache"], case["tables"], longest).permute(0, 2, 1, 3).contiguous()
    v = dense(case["v_cache"], case["tables"], longest).permute(0, 2, 1, 3).contiguous()
    q4 = q.unsqueeze(2)  # [B, Hq, 1, D]
    mask = None
    if bool((lens != longest).any()):
        mask = (torch.arange(longest, device=q.device)[None, :] < lens[:, None])[:, None, None]
    kw: dict[str, Any] = {"attn_mask": mask, "scale": scale}
    note = "dense copy" + (", masked" if mask is not None else "")
    if q.shape[1] != k.shape[1]:
        try:
            F.scaled_dot_product_attention(q4[:1], k[:1], v[:1], scale=scale, enable_gqa=True)
            kw["enable_gqa"] = True
            note += ", enable_gqa"
        except TypeError:  # torch < 2.5: repeat the KV heads
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            note += ", repeated KV heads"
    return (lambda: F.scaled_dot_product_attention(q4, k, v, **kw).squeeze(2)), note


# ----------------------------------------------------------------------------- prefill


def prefill_peer(name: str, case: dict, scale: float) -> tuple[Fn, str]:
    """A call of peer `name` on the case's prefill batch ([Tq, Hq, D] out) and a note."""
    q, tables = case["q"], case["tables"]
    ctx, q_lens = case["ctx"], case["q_lens"]
    keys = [dense(case["k_cache"], tables[s : s + 1], c)[0] for s, c in enumerate(ctx)]
    values = [dense(case["v_cache"], tables[s : s + 1], c)[0] for s, c in enumerate(ctx)]
    if name == "sdpa":
        return _sdpa_prefill(q, keys, values, q_lens, scale)
    module = importlib.import_module(PAGED_PEERS[name])
    k, v = torch.cat(keys), torch.cat(values)
    del keys, values
    dev = q.device
    cu_q = torch.tensor([0, *_cumsum(q_lens)], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, *_cumsum(ctx)], dtype=torch.int32, device=dev)

    def call() -> torch.Tensor:
        out = module.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(q_lens), max(ctx), softmax_scale=scale, causal=True
        )
        return _first(out)

    return call, "contiguous K/V (varlen)"


def _cumsum(values: list[int]) -> list[int]:
    total, out = 0, []
    for v in values:
        total += v
        out.append(total)
    return out


def _sdpa_prefill(q, keys, values, q_lens, scale) -> tuple[Fn, str]:
    group = q.shape[1] // keys[0].shape[1]
    calls, start = [], 0
    try:
        from torch.nn.attention.bias import causal_lower_right
    except ImportError:  # older torch: an explicit mask
        causal_lower_right = None
    for k, v, n in zip(keys, values, q_lens, strict=True):
        qs = q[start : start + n].permute(1, 0, 2).unsqueeze(0)  # [1, Hq, L, D]
        ks = k.repeat_interleave(group, 1).permute(1, 0, 2).unsqueeze(0).contiguous()
        vs = v.repeat_interleave(group, 1).permute(1, 0, 2).unsqueeze(0).contiguous()
        c = k.shape[0]
        if n == c:
            kw: dict[str, Any] = {"is_causal": True}
        elif causal_lower_right is not None:
            kw = {"attn_mask": causal_lower_right(n, c)}
        else:
            pos = torch.arange(c - n, c, device=q.device)
            kw = {"attn_mask": torch.arange(c, device=q.device)[None, :] <= pos[:, None]}
        calls.append((qs, ks, vs, kw))
        start += n

    def call() -> torch.Tensor:
        outs = [
            F.scaled_dot_product_attention(qs, ks, vs, scale=scale, **kw)[0].permute(1, 0, 2)
            for qs, ks, vs, kw in calls
        ]
        return torch.cat(outs)

    return call, "one SDPA call per sequence, KV heads repeated"


def prefill_flops(q_lens: list[int], ctx: list[int], num_heads: int, head_dim: int) -> float:
    """Multiply-adds x 2 of causal attention: QK^T and PV over each query's visible keys."""
    visible = sum(n * (c - n) + n * (n + 1) / 2 for n, c in zip(q_lens, ctx, strict=True))
    return 4.0 * num_heads * head_dim * visible


def kv_case_bytes(lens: list[int], block_size: int, num_kv_heads: int, head_dim: int,
                  elem: int) -> int:  # fmt: skip
    """Bytes of a paged K + V cache holding sequences of `lens` tokens."""
    blocks = sum(math.ceil(n / block_size) for n in lens)
    return 2 * blocks * block_size * num_kv_heads * head_dim * elem
