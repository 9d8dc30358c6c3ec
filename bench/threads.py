"""Torch threads of a CPU daemon under load (1, n-1 and n on n cores), and what a preview costs.

    .venv/bin/python bench/threads.py [--cores 2 4] [--rounds 3] [--count 30]
    .venv/bin/python bench/threads.py --preview-only

A real daemon (tiny model, `fsd start --foreground --threads T`) per setting, with
this process and everything it starts pinned to the first n usable CPUs
(os.sched_setaffinity; the daemon and its clients inherit it), as a user's machine of n
cores. Per setting, through the client SDK:

- idle: `fsctl submit --max-tokens 128 --ignore-eos` alone: TTFT and tokens/s (median of
  --rounds);
- loaded: an inject burst (--count jobs of 256 prompt and 64 output tokens, as
  `fsctl inject`) with the same streamed submit sent just after it: the burst's wall
  time and the stream's TTFT and tokens/s.

Then, with the default thread count on 2 cores: tokens/s streamed by --streams client
threads looping 64-token jobs, over --window seconds, with and without a what-if
preview (`fsctl retune --preview policy=fcfs`) running beside them, alternating
--rounds times; the twin's CPU seconds in the window show it did run.
Prints tables and writes JSON (default bench/results/threads-cpu.json) with the
machine and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import write_result  # noqa: E402

from fsd.engine.threads import choose_threads  # noqa: E402
from tests.server.daemon_proc import Daemon, start_daemon  # noqa: E402

PROMPT = "The scheduler says"
STREAM_TOKENS = 128


def stream_once(d: Daemon, tokens: int = STREAM_TOKENS) -> dict:
    """One streamed submit, as `fsctl submit --stats`: TTFT and tokens / latency."""
    with d.client(timeout=600) as c:
        h = c.generate(PROMPT, max_tokens=tokens, ignore_eos=True)
        for _ in h:
            pass
        done = h.result()
    t = done.timings
    n = len(done.token_ids)
    return {"ttft_ms": (t.ttft or 0) * 1e3, "tokens_per_s": n / max(t.latency or 0, 1e-9)}


def burst_with_stream(d: Daemon, count: int, timeout: float) -> dict:
    """An inject burst (count x 256/64) and a streamed submit sent right after it."""
    out: dict = {}
    with d.client(timeout=600) as c:
        start = time.perf_counter()
        ids = c.inject(burst=(count, 256, 64), tag="bench")
        probe = threading.Thread(target=lambda: out.update(stream_once(d)))
        probe.start()
        try:
            c.wait_injected(ids, timeout=timeout)
            out["burst_s"] = time.perf_counter() - start
        except TimeoutError:
            out["burst_s"] = None  # did not end within --burst-timeout
        probe.join(timeout)
    return out


def run_threads(cpus: list[int], threads: int, args: argparse.Namespace) -> dict:
    os.sched_setaffinity(0, cpus)
    with tempfile.TemporaryDirectory() as tmp:
        d = start_daemon(Path(tmp), "", "--threads", str(threads))
        try:
            stream_once(d, 8)  # warm-up: first-call allocations
            idle = [stream_once(d) for _ in range(args.rounds)]
            loaded = [
                burst_with_stream(d, args.count, args.burst_timeout) for _ in range(args.rounds)
            ]
        finally:
            d.stop()
    return {
        "cores": len(cpus),
        "threads": threads,
        "idle_runs": idle,
        "loaded_runs": loaded,
        "idle_ttft_ms": _median(r["ttft_ms"] for r in idle),
        "idle_tokens_per_s": _median(r["tokens_per_s"] for r in idle),
        "loaded_ttft_ms": _median(r.get("ttft_ms") for r in loaded),
        "loaded_tokens_per_s": _median(r.get("tokens_per_s") for r in loaded),
        "burst_s": _median(r["burst_s"] for r in loaded),
        "burst_timeouts": sum(r["burst_s"] is None for r in loaded),
    }


def _median(values) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


# ---- a preview beside serving ------------------------------------------------------


class Load:
    """Client threads looping streamed 64-token jobs; (time, tokens) of every chunk."""

    def __init__(self, d: Daemon, streams: int) -> None:
        self.events: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(d,)) for _ in range(streams)]
        for t in self.threads:
            t.start()

    def _loop(self, d: Daemon) -> None:
        with d.client(timeout=600, operator=False) as c:
            while not self.stop.is_set():
                for chunk in c.generate(PROMPT, max_tokens=64, ignore_eos=True):
                    self.events.append((time.monotonic(), len(chunk.token_ids)))

    def rate(self, start: float, end: float) -> float:
        return sum(n for t, n in self.events if start <= t < end) / (end - start)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def twin_cpu_seconds(daemon_pid: int) -> float:
    """User + system CPU seconds of the daemon's spawned workers (the preview twin)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{daemon_pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            try:
                if b"spawn_main" not in Path(f"/proc/{kid}/cmdline").read_bytes():
                    continue  # the resource tracker
                fields = Path(f"/proc/{kid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                continue
    return total


def preview_round(d: Daemon, with_preview: bool, args: argparse.Namespace) -> dict:
    load = Load(d, args.streams)
    done = threading.Event()
    previews: list[float] = []

    def previewing() -> None:
        with d.client(timeout=600) as c:
            while not done.is_set():
                t0 = time.perf_counter()
                c.preview(horizon=args.horizon, seeds=2, policy="fcfs")
                previews.append(time.perf_counter() - t0)

    try:
        time.sleep(2.0)  # the load reaches its steady state; the twin sees live jobs
        pv = threading.Thread(target=previewing) if with_preview else None
        cpu0 = twin_cpu_seconds(d.proc.pid)
        start = time.monotonic()
        if pv is not None:
            pv.start()
        time.sleep(args.window)
        end = time.monotonic()
        cpu1 = twin_cpu_seconds(d.proc.pid)
        done.set()
        if pv is not None:
            pv.join()
    finally:
        load.close()
    return {
        "preview": with_preview,
        "tokens_per_s": load.rate(start, end),
        "twin_cpu_s": cpu1 - cpu0,
        "previews_done": len(previews),
        "preview_s": previews,
    }


def run_preview(cpus: list[int], args: argparse.Namespace) -> dict:
    os.sched_setaffinity(0, cpus)
    threads = choose_threads(len(cpus)).count or 1
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        d = start_daemon(Path(tmp), "", "--threads", str(threads))
        try:
            stream_once(d, 8)
            for _ in range(args.rounds):
                for with_preview in (False, True):
                    rounds.append(preview_round(d, with_preview, args))
        finally:
            d.stop()
    off = _median(r["tokens_per_s"] for r in rounds if not r["preview"])
    on = _median(r["tokens_per_s"] for r in rounds if r["preview"])
    return {
        "cores": len(cpus),
        "threads": threads,
        "rounds": rounds,
        "tokens_per_s_without": off,
        "tokens_per_s_with": on,
        "slowdown": 1.0 - on / off if on and off else None,
    }


# ---- main ---------------------------------------------------------------------------


def _fmt(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cores", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=30, help="jobs in the inject burst")
    ap.add_argument("--burst-timeout", type=float, default=180.0)
    ap.add_argument("--streams", type=int, default=4, help="preview: client threads of load")
    ap.add_argument("--window", type=float, default=15.0, help="preview: seconds measured")
    ap.add_argument("--horizon", type=float, default=120.0, help="preview: simulated seconds")
    ap.add_argument("--preview-only", action="store_true")
    ap.add_argument("--json", default="bench/results/threads-cpu.json")
    args = ap.parse_args()

    usable = sorted(os.sched_getaffinity(0))
    load_before = os.getloadavg()
    threads_runs: list[dict] = []
    unmeasured = [n for n in args.cores if n > len(usable)]
    if not args.preview_only:
        for n in (n for n in args.cores if n <= len(usable)):
            for t in sorted({1, max(1, n - 1), n}):
                threads_runs.append(run_threads(usable[:n], t, args))
    preview = run_preview(usable[:2], args) if len(usable) >= 2 else None
    os.sched_setaffinity(0, usable)
    load_after = os.getloadavg()

    console = Console()
    table = Table(
        title=f"tiny on n CPU cores: 1 stream of {STREAM_TOKENS} tokens idle, and "
        f"beside a {args.count} x 256/64 burst (median of {args.rounds})"
    )
    for col in (
        "cores",
        "threads",
        "default",
        "idle TTFT ms",
        "idle tok/s",
        "loaded TTFT ms",
        "loaded tok/s",
        "burst s",
    ):
        table.add_column(col, justify="right")
    for r in threads_runs:
        default = choose_threads(r["cores"]).count == r["threads"]
        table.add_row(
            str(r["cores"]), str(r["threads"]), "yes" if default else "",
            _fmt(r["idle_ttft_ms"], ".1f"), _fmt(r["idle_tokens_per_s"]),
            _fmt(r["loaded_ttft_ms"], ".1f"), _fmt(r["loaded_tokens_per_s"]),
            _fmt(r["burst_s"], ".1f"),
        )  # fmt: skip
    console.print(table)
    for n in unmeasured:
        console.print(f"{n} cores: not measurable here ({len(usable)} usable CPUs)")
    if preview is not None:
        console.print(
            f"preview beside serving ({preview['cores']} cores, {preview['threads']} thread): "
            f"{_fmt(preview['tokens_per_s_without'])} tok/s without, "
            f"{_fmt(preview['tokens_per_s_with'])} with; slowdown "
            f"{_fmt(100 * (preview['slowdown'] or 0), '.1f')}% (goal <= 20%); twin CPU "
            f"{sum(r['twin_cpu_s'] for r in preview['rounds'] if r['preview']):.1f} s"
        )
    out = write_result(
        args.json, vars(args),
        usable_cpus=len(usable), load_average_before=load_before,
        load_average_after=load_after, not_measured_cores=unmeasured,
        threads=threads_runs, preview=preview,
    )  # fmt: skip
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
