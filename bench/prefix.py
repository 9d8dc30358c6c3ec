"""Prefix caching (P12): the Mooncake trace in the simulator, and multi-turn chat on
the real CPU engine, each with the cache on and off.

    .venv/bin/python bench/prefix.py                # both sections (~20 min on 2 cores)
    .venv/bin/python bench/prefix.py --only chat    # the CPU engine part (~1 min)

sim   scenarios/traces/mooncake-conversation.jsonl (12,031 long-context requests, 512-token
      prefix-block hashes) on llama3.1-8b-h100 (128k context), the default policy
      and KV policy, a host tier of 1 TB, at two loads (`--scales`, x the trace's
      rate). Reports the prefix hit rate (prompt tokens each job's first prefill
      found cached / all prompt tokens) against the unbounded-cache bound (a block
      counts once any earlier request had it: 36.6% of the trace's 512-token blocks,
      computed here in the same tokens at the profile's block size), by tier,
      prefill tokens saved, mean TTFT and P95 per-token latency against the cache
      off. Target: hit rate >= 0.9 x the bound.
chat  scenarios/chat/multi-turn.toml on the embedded model (CPU), closed loop: a
      turn's prompt is its conversation so far, sent `think` s after the last
      reply. Reports prompt tokens, prefill tokens computed and saved, and TTFT.

Prints a table per section; writes bench/results/prefix-cpu.json (a section run
alone replaces only its own part).
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe_machine  # noqa: E402

from fsd import LLM, SamplingParams  # noqa: E402
from fsd.config import CacheConfig, SchedConfig  # noqa: E402
from fsd.cost.profiles import load_profile  # noqa: E402
from fsd.metrics import percentile  # noqa: E402
from fsd.sim.capacity import max_context_of, size_pools  # noqa: E402
from fsd.sim.runner import RunSpec, run_one  # noqa: E402
from fsd.workload.chat import conversations, load_chat, system_prompt  # noqa: E402
from fsd.workload.mooncake import MOONCAKE_BLOCK_TOKENS, read_mooncake  # noqa: E402
from fsd.workload.spec import Workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "scenarios" / "traces" / "mooncake-conversation.jsonl"
CHAT = ROOT / "scenarios" / "chat" / "multi-turn.toml"
OUT = ROOT / "bench" / "results" / "prefix-cpu.json"
PROFILE = "llama3.1-8b-h100"
HOST_BYTES = 10**12  # 1 TB
TARGET = 0.9  # of the unbounded bound


def _block_keys(w: Workload, i: int, block_size: int) -> list[tuple[int, int]]:
    """Request i's full `block_size` blocks, each named as the simulator names it."""
    hashes, n = w.prefix_of(i), w[i].prompt_len // block_size
    keys = []
    for k in range(n):
        j = ((k + 1) * block_size - 1) // MOONCAKE_BLOCK_TOKENS
        if j >= len(hashes):
            break
        keys.append((hashes[j], k))
    return keys


def lru_bound(w: Workload, block_size: int, capacity: int) -> float:
    """The share of prompt tokens an ideal LRU cache of `capacity` blocks reuses: every
    request's blocks cached the moment it arrives, no job ever holding one. What the
    tiers' size allows, against `reuse_bound`'s cache that never evicts."""
    lru: OrderedDict[tuple[int, int], None] = OrderedDict()
    hit = total = 0
    for i, r in enumerate(w):
        total += r.prompt_len
        leading = True
        for key in _block_keys(w, i, block_size):
            leading = leading and key in lru
            hit += block_size * leading
            lru[key] = None
            lru.move_to_end(key)
            if len(lru) > capacity:
                lru.popitem(last=False)
    return hit / max(total, 1)


def reuse_bound(w: Workload, block_size: int) -> tuple[float, float]:
    """(tokens, trace blocks): the share a cache that never evicts, shared by jobs that
    never overlap, could reuse: in tokens of full `block_size` blocks (what fsd caches),
    and in the trace's own 512-token blocks."""
    seen: set[tuple[int, int]] = set()
    seen_ids: set[int] = set()
    reused = total = ids_reused = ids = 0
    for i, r in enumerate(w):
        total += r.prompt_len
        for h in w.prefix_of(i):
            ids += 1
            ids_reused += h in seen_ids
            seen_ids.add(h)
        for key in _block_keys(w, i, block_size):
            reused += block_size * (key in seen)
            seen.add(key)
    return reused / max(total, 1), ids_reused / max(ids, 1)


def sim_section(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    cost = load_profile(PROFILE)
    ctx = max_context_of(cost) or 131_072
    cache = CacheConfig()
    host = int(args.host_bytes) // (cost.kv_bytes_per_token * cache.block_size)
    device = size_pools(cost, cache, num_host_blocks=host).device
    rows = []
    for scale in args.scales:
        w = read_mooncake(MOONCAKE, scale, args.limit).clipped(ctx)
        bound, bound_blocks = reuse_bound(w, cache.block_size)
        fits = lru_bound(w, cache.block_size, device + host)
        res = {}
        for on in (True, False):
            cache_on = CacheConfig(prefix_cache=on)
            spec = RunSpec("on" if on else "off", SchedConfig(), cache_on, num_host_blocks=host)
            t0 = time.perf_counter()
            m = run_one(spec, cost, w)
            res[on] = {k: v for k, v in m.items() if isinstance(v, (int, float))}
            res[on]["wall_s"] = time.perf_counter() - t0
            console.print(f"x{scale} cache {'on' if on else 'off'}: {res[on]['wall_s']:.0f} s")
        on, off = res[True], res[False]
        rows.append(
            {
                "scale": scale,
                "requests": len(w),
                "bound": bound,
                "bound_512_blocks": bound_blocks,
                "lru_bound": fits,
                "of_lru_bound": on["prefix_hit_rate"] / fits if fits else 0.0,
                "hit_rate": on["prefix_hit_rate"],
                "of_bound": on["prefix_hit_rate"] / bound if bound else 0.0,
                "hit_device": on["prefix_hit_rate_device"],
                "hit_host": on["prefix_hit_rate_host"],
                "prefill_tokens_saved": on["prefill_tokens_saved"],
                "evictions_device": on["prefix_evictions"],
                "evictions_host": on["prefix_host_evictions"],
                "ttft_on": on["ttft"],
                "ttft_off": off["ttft"],
                "ttft_p95_on": on["ttft_p95"],
                "ttft_p95_off": off["ttft_p95"],
                "p95_ptl_on": on["p95"],
                "p95_ptl_off": off["p95"],
                "avg_ptl_on": on["avg"],
                "avg_ptl_off": off["avg"],
                "sim_s_on": on["wall_s"],
                "sim_s_off": off["wall_s"],
            }
        )
    tb = args.host_bytes / 1e12
    t = Table(title=f"Mooncake conversation, {PROFILE}, host {tb:g} TB ({host} blocks)")
    for col in ("load", "hit rate", "bound", "of bound", "LRU bound", "of it", "device", "host",
                "saved tok",
                "TTFT on/off", "P95 tok on/off"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            f"x{r['scale']}", f"{r['hit_rate']:.1%}", f"{r['bound']:.1%}",
            f"{r['of_bound']:.2f}", f"{r['lru_bound']:.1%}", f"{r['of_lru_bound']:.2f}",
            f"{r['hit_device']:.1%}", f"{r['hit_host']:.1%}",
            f"{r['prefill_tokens_saved']:,}", f"{r['ttft_on']:.2f}/{r['ttft_off']:.2f} s",
            f"{r['p95_ptl_on'] * 1e3:.0f}/{r['p95_ptl_off'] * 1e3:.0f} ms",
        )  # fmt: skip
    console.print(t)
    return {
        "profile": PROFILE,
        "host_bytes": args.host_bytes,
        "host_blocks": host,
        "device_blocks": device,
        "target_of_bound": TARGET,
        "rows": rows,
    }


def run_chat(llm: LLM, path: Path) -> dict[str, Any]:
    """Every conversation closed loop on `llm`'s engine, in wall time."""
    eng = llm.engine
    spec = load_chat(path)
    vocab = 256  # byte ids: every model's tokenizer has them
    system = list(system_prompt(spec, vocab))
    convs = conversations(spec, vocab)
    t0 = time.time()
    due: list[tuple[float, int]] = [(t0 + c.start, i) for i, c in enumerate(convs)]
    heapq.heapify(due)
    history = {i: list(system) for i in range(len(convs))}
    turn = dict.fromkeys(range(len(convs)), 0)
    live: dict[str, int] = {}
    ttft: list[float] = []
    prompt_tokens = cached = 0
    while due or live:
        now = time.time()
        while due and due[0][0] <= now:
            _, i = heapq.heappop(due)
            c, k = convs[i], turn[i]
            history[i] += c.messages[k]
            job = eng.add_request(
                list(history[i]), SamplingParams(max_tokens=c.replies[k], ignore_eos=True)
            )
            live[job.job_id] = i
        if not live:
            time.sleep(max(0.0, min(due[0][0] - time.time(), 0.05)))
            continue
        for delta in eng.step():
            out = delta.output
            if out is None or out.finish_reason is None:
                continue
            i = live.pop(delta.job_id)
            ttft.append(out.ttft or 0.0)
            prompt_tokens += len(out.prompt_token_ids)
            cached += out.cached_tokens
            history[i] += out.token_ids
            turn[i] += 1
            if turn[i] < len(convs[i].messages):
                heapq.heappush(due, (time.time() + spec.think, i))
    a = np.array(ttft)
    return {
        "turns": len(ttft),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "prefill_tokens": prompt_tokens - cached,
        "ttft_mean": float(a.mean()),
        "ttft_p50": percentile(a, 50),
        "ttft_p95": percentile(a, 95),
        "wall_s": time.time() - t0,
    }


def chat_section(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    res = {}
    for on in (False, True):
        with LLM(args.model, prefix_cache=on) as llm:
            res["on" if on else "off"] = run_chat(llm, CHAT)
    t = Table(title=f"multi-turn chat ({CHAT.relative_to(ROOT)}), {args.model} on CPU")
    for col in ("cache", "turns", "prompt tok", "prefilled", "saved", "TTFT mean", "p50", "p95"):
        t.add_column(col, justify="right")
    for k, r in res.items():
        t.add_row(
            k, str(r["turns"]), f"{r['prompt_tokens']:,}", f"{r['prefill_tokens']:,}",
            f"{r['cached_tokens'] / r['prompt_tokens']:.1%}", f"{r['ttft_mean'] * 1e3:.1f} ms",
            f"{r['ttft_p50'] * 1e3:.1f} ms", f"{r['ttft_p95'] * 1e3:.1f} ms",
        )  # fmt: skip
    console.print(t)
    scenario = str(CHAT.relative_to(ROOT))
    return {
        "model": args.model,
        "scenario": scenario,
        "torch_threads": torch.get_num_threads(),
        **res,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("sim", "chat"))
    ap.add_argument("--scales", type=float, nargs="+", default=(0.1, 0.2))
    ap.add_argument("--host-bytes", type=float, default=HOST_BYTES, help="host tier (sim)")
    ap.add_argument("--limit", type=int, default=None, help="the first N Mooncake requests")
    ap.add_argument("--model", default="tiny")
    args = ap.parse_args()
    console = Console()
    data: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
    data["machine"] = describe_machine(torch.device("cpu"))
    if args.only in (None, "chat"):
        data["chat"] = chat_section(args, console)
    if args.only in (None, "sim"):
        if not MOONCAKE.exists():
            console.print(f"skipping sim: {MOONCAKE} is not there")
        else:
            key = "sim" if args.host_bytes == HOST_BYTES else f"sim-host-{args.host_bytes:g}"
            data[key] = sim_section(args, console)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    console.print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
