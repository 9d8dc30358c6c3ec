"""Serving over loopback: tokens/s streamed to clients, and what telemetry costs.

    .venv/bin/python bench/serve.py [--clients 8] [--jobs 40] [--tokens 32] [--rounds 3]

A real daemon (tiny model) per setting; `--clients` client processes each stream
`--jobs` jobs. Telemetry's cost is read two ways: directly, as the engine thread's time in
telemetry over its time in iterations (the daemon's status reports both); and as
the iteration rate under the same saturating load with telemetry at 10 Hz and off,
alternating `--rounds` times (the machine's noise is of the same order, so the
median is reported).
Prints a table and writes JSON (default bench/results/serve-<device>.json).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import write_result  # noqa: E402

from fsd.client import Client  # noqa: E402
from tests.server.daemon_proc import start_daemon  # noqa: E402


def _client(endpoint: str, jobs: int, tokens: int, seed: int, out: mp.Queue) -> None:
    streamed = 0
    with Client(endpoint, timeout=120) as c:
        handles = [
            c.submit([(seed * 17 + i) % 250 + 1] * 16, max_tokens=tokens, ignore_eos=True)
            for i in range(jobs)
        ]
        for h in handles:
            for chunk in h:
                streamed += len(chunk.token_ids)
    out.put(streamed)


def run_load(telemetry_hz: float, clients: int, jobs: int, tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        config = f"[sched]\nmax_batch_size = 32\n[server]\ntelemetry_hz = {telemetry_hz}\n"
        d = start_daemon(Path(tmp), config)
        try:
            with d.client() as c:
                before = c.status()
            ctx = mp.get_context("spawn")
            out = ctx.Queue()
            procs = [
                ctx.Process(target=_client, args=(d.endpoint, jobs, tokens, k, out))
                for k in range(clients)
            ]
            start = time.perf_counter()
            for p in procs:
                p.start()
            streamed = sum(out.get(timeout=900) for _ in procs)
            elapsed = time.perf_counter() - start
            for p in procs:
                p.join()
            with d.client() as c:
                after = c.status()
        finally:
            d.stop()
    iterations = after.iterations - before.iterations
    step_s = after.step_seconds - before.step_seconds
    telemetry_s = after.telemetry_seconds - before.telemetry_seconds
    return {
        "step_seconds": step_s,
        "telemetry_seconds": telemetry_s,
        "telemetry_share": telemetry_s / step_s if step_s else 0.0,
        "telemetry_hz": telemetry_hz,
        "tokens_streamed": streamed,
        "seconds": elapsed,
        "tokens_per_s": streamed / elapsed,
        "iterations": iterations,
        "iterations_per_s": iterations / elapsed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="bench/results/serve-cpu.json")
    args = ap.parse_args()

    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for _ in range(args.rounds):
        for key, hz in (("on", 10.0), ("off", 0.0)):
            runs[key].append(run_load(hz, args.clients, args.jobs, args.tokens))
    med = {
        k: {m: statistics.median(r[m] for r in v) for m in ("tokens_per_s", "iterations_per_s")}
        for k, v in runs.items()
    }
    overhead = 1.0 - med["on"]["iterations_per_s"] / med["off"]["iterations_per_s"]
    share = statistics.median(r["telemetry_share"] for r in runs["on"])

    table = Table(
        title=f"fsd serving over loopback: {args.clients} clients x {args.jobs} jobs "
        f"x {args.tokens} tokens (tiny, CPU), median of {args.rounds}"
    )
    for col in ("telemetry", "tokens/s streamed", "iterations/s"):
        table.add_column(col, justify="right")
    for key, label in (("on", "10 Hz"), ("off", "off")):
        table.add_row(
            label, f"{med[key]['tokens_per_s']:.0f}", f"{med[key]['iterations_per_s']:.1f}"
        )
    console = Console()
    console.print(table)
    console.print(
        f"telemetry on the engine thread: {100 * share:.2f}% of iteration time (goal <= 2%); "
        f"A/B iteration rate difference {100 * overhead:+.1f}% (noise of the same order)"
    )

    out = write_result(
        args.json, vars(args),
        runs=runs, median=med, telemetry_engine_share=share, telemetry_overhead=overhead,
    )  # fmt: skip
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
