"""Soak: does a real daemon keep anything per finished request?

    .venv/bin/python bench/soak.py                      # 200,000 requests, cycles of 10,000
    .venv/bin/python bench/soak.py --quick              # 40,000 requests, cycles of 5,000
    .venv/bin/python bench/soak.py --requests N --cycle C --json PATH

A real daemon (`fsd start --foreground`, the tiny model, a small KV pool so jobs are
preempted and swapped, the HTTP API on) serves cycles of mixed requests: SDK streamed
and not, OpenAI HTTP streamed and not, jobs aborted mid-stream, SDK clients and HTTP
connections that leave mid-stream, retunes, prompts that share a prefix (cache hits)
and prompts that do not. Each cycle opens fresh connections and closes them all; the
daemon is then left to become idle, and its RSS, open file descriptors and threads are
read from /proc, and Python's allocated blocks and GC-tracked objects from its
/metrics. Memory a daemon keeps per request shows as a slope over requests after the
first cycle (which warms allocator pools, caches and compiled paths): RSS in KB per
request, and blocks and objects per request (exact counts: one string kept per
request is a slope of 1); then the change in descriptors and threads after the first
cycle, and a table per cycle. Writes JSON (default
bench/results/soak-cpu.json) with the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import table_of, write_result  # noqa: E402

from fsd.client import AsyncClient  # noqa: E402
from fsd.errors import FsdError  # noqa: E402
from tests.server.daemon_proc import Daemon, free_port, pool_config, start_daemon  # noqa: E402

# what each request does, with its share of a cycle
KINDS = {
    "sdk": 0.33,  # SDK, whole result
    "sdk-stream": 0.20,
    "sdk-abort": 0.07,  # SDK stream, aborted after its first token
    "sdk-leave": 0.05,  # its own SDK client, closed after the first token
    "http": 0.15,
    "http-stream": 0.12,
    "http-leave": 0.08,  # HTTP stream, connection dropped after the first chunk
}
PREFIXES = 8  # shared prompt prefixes (48 tokens each): half the prompts hit one
RETUNE_EVERY = 500  # requests between two retunes (q1 alternates)
REQUEST_LIMIT = 300.0  # seconds before a request counts as lost


@dataclass(frozen=True)
class SoakSpec:
    """One soak run's shape."""

    requests: int = 200_000
    cycle: int = 10_000
    concurrency: int = 48  # requests in flight at once
    gpu_blocks: int = 48  # 768 tokens of device KV: jobs are preempted and swapped
    max_batch_size: int = 16
    seed: int = 0
    # the SLO statistics keep every finish of this many seconds: a window that fills
    # for its first minute (the CI run's cycles are shorter than the default 60 s)
    slo_window: float = 60.0
    trace: bool = False  # PYTHONTRACEMALLOC=1: the daemon's exact Python bytes (slower)


@dataclass
class Sample:
    """The daemon after one cycle, idle."""

    cycle: int
    requests: int  # served so far
    rss_mb: float
    fds: int
    threads: int
    seconds: float
    blocks: int = 0  # Python's allocated blocks (the daemon's /metrics)
    objects: int = 0  # objects tracked by its garbage collector
    traced: int = 0  # bytes Python holds (with `trace`)
    kinds: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    unanswered: int = 0  # of the errors: requests with no answer within REQUEST_LIMIT
    failures: dict[str, int] = field(default_factory=dict)  # "kind: error" -> count


def usage(pid: int) -> tuple[float, int, int]:
    """(RSS in MB, open descriptors, threads) of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kb = int(fields["VmRSS"].split()[0])
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    return rss_kb / 1024, fds, int(fields["Threads"])


def python_figures(http_port: int) -> dict[str, int]:
    """The daemon's own Python figures from its /metrics: allocated blocks, GC-tracked
    objects and (when it traces) traced bytes, by their names less `fsd_python_`."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=30).read()
    got = {}
    for line in body.decode().splitlines():
        name, _, value = line.partition(" ")
        name = name.split("{", 1)[0]  # its labels (model_name)
        if name.startswith("fsd_python_"):
            got[name.removeprefix("fsd_python_")] = int(float(value))
    return got


def prompt_of(rng: random.Random) -> list[int]:
    if rng.random() < 0.5:  # a shared prefix and a fresh tail: a prefix-cache hit
        group = rng.randrange(PREFIXES)
        return [10 + group] * 48 + [rng.randrange(32, 250) for _ in range(8)]
    return [rng.randrange(32, 250) for _ in range(rng.randrange(24, 64))]


class Load:
    """One cycle's requests, `concurrency` at a time, over fresh connections."""

    def __init__(self, daemon: Daemon, spec: SoakSpec, rng: random.Random) -> None:
        self.daemon = daemon
        self.spec = spec
        self.rng = rng
        self.kinds: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.errors = 0
        self.unanswered = 0
        self.failures: Counter[str] = Counter()
        self.sdk: AsyncClient | None = None
        self.http: aiohttp.ClientSession | None = None

    async def run(self, count: int, first: int) -> None:
        token = self.daemon.token
        self.sdk = AsyncClient(self.daemon.endpoint, timeout=120.0, token=token)
        self.http = aiohttp.ClientSession(f"http://127.0.0.1:{self.daemon.http_port}")
        slots = asyncio.Semaphore(self.spec.concurrency)
        try:
            async with asyncio.TaskGroup() as group:
                for i in range(count):
                    await slots.acquire()
                    if (first + i) % RETUNE_EVERY == 0:
                        await self.sdk.retune(q1=0.05 if (first + i) // RETUNE_EVERY % 2 else 0.02)
                    task = group.create_task(self.one(self.pick()))
                    task.add_done_callback(lambda _t: slots.release())
        finally:
            await self.sdk.close()
            await self.http.close()

    def pick(self) -> str:
        return self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]

    async def one(self, kind: str) -> None:
        prompt = prompt_of(self.rng)
        tokens = self.rng.randrange(1, 9) if "leave" not in kind and kind != "sdk-abort" else 64
        try:
            async with asyncio.timeout(REQUEST_LIMIT):  # an answer lost is an error, not a hang
                if kind.startswith("sdk"):
                    await self._sdk(kind, prompt, tokens)
                else:
                    await self._http(kind, prompt, tokens)
            self.kinds[kind] += 1
        except TimeoutError:
            self.errors += 1
            self.unanswered += 1
            self.failures[f"{kind}: unanswered"] += 1
        except (FsdError, aiohttp.ClientError) as exc:
            self.errors += 1
            self.failures[f"{kind}: {type(exc).__name__}: {str(exc)[:160]}"] += 1

    async def _sdk(self, kind: str, prompt: list[int], tokens: int) -> None:
        assert self.sdk is not None
        params = {"max_tokens": tokens, "ignore_eos": True}
        if kind == "sdk":
            await self.sdk.complete(prompt, **params)
            return
        own = kind == "sdk-leave"
        client = AsyncClient(self.daemon.endpoint, timeout=120.0) if own else self.sdk
        try:
            handle = await client.submit(prompt, **params)
            async for _chunk in handle:
                if kind == "sdk-abort":
                    await handle.abort()
                if kind != "sdk-stream":
                    break
        finally:
            if own:
                await client.close()  # its job is the daemon's to abort

    async def _http(self, kind: str, prompt: list[int], tokens: int) -> None:
        assert self.http is not None
        body = {"model": "tiny", "prompt": prompt, "max_tokens": tokens, "ignore_eos": True}
        if kind == "http":
            async with self.http.post("/v1/completions", json=body) as resp:
                await resp.read()
                resp.raise_for_status()
            return
        async with self.http.post("/v1/completions", json={**body, "stream": True}) as resp:
            resp.raise_for_status()
            async for _line in resp.content:
                if kind == "http-leave":
                    resp.close()  # the connection goes with it
                    return


def wait_idle(daemon: Daemon, timeout: float = 300.0) -> None:
    """Until the daemon holds no job; then 2 s for its loop to let go of them and give
    freed heap back (it trims after 1 s idle: `fsd.server.heap_trim`)."""
    deadline = time.time() + timeout
    with daemon.client(timeout=30.0) as c:
        while c.status().jobs:
            if time.time() > deadline:
                raise RuntimeError(f"the daemon still has jobs after {timeout:g} s")
            time.sleep(0.2)
    time.sleep(2.0)


def soak(spec: SoakSpec, folder: Path, progress: bool = True) -> list[Sample]:
    """Run the cycles against a fresh daemon; one sample per cycle (module doc)."""
    config = pool_config(spec.gpu_blocks, spec.max_batch_size, 10, slo_window=spec.slo_window)
    port = free_port()
    env = {"PYTHONTRACEMALLOC": "1"} if spec.trace else None
    daemon = start_daemon(folder, config, "--http", f"127.0.0.1:{port}", env=env)
    daemon.http_port = port  # type: ignore[attr-defined]
    rng = random.Random(spec.seed)
    samples: list[Sample] = []
    try:
        done = 0
        cycle = 0
        while done < spec.requests:
            count = min(spec.cycle, spec.requests - done)
            start = time.perf_counter()
            load = Load(daemon, spec, rng)
            asyncio.run(load.run(count, done))
            wait_idle(daemon)
            done += count
            cycle += 1
            rss, fds, threads = usage(daemon.proc.pid)  # before /metrics opens a connection
            py = python_figures(port)
            blocks, objects = py["allocated_blocks"], py["gc_objects"]
            sample = Sample(
                cycle, done, round(rss, 1), fds, threads, round(time.perf_counter() - start, 1),
                blocks, objects, py.get("traced_bytes", 0), load.kinds, load.errors,
                load.unanswered, dict(load.failures),
            )  # fmt: skip
            samples.append(sample)
            if progress:
                print(
                    f"cycle {cycle}: {done} requests, RSS {rss:.1f} MB, {blocks} blocks, "
                    f"{objects} objects, {fds} fds, {threads} threads, "
                    f"{sample.seconds:.0f} s, {load.errors} errors ({load.unanswered} unanswered)",
                    flush=True,
                )
    finally:
        daemon.stop()
    return samples


def slope(samples: list[Sample], skip: int = 1, of: str = "rss_mb", scale: float = 1024) -> float:
    """Least-squares slope of a figure over requests after the first `skip` cycles (they
    warm the allocator, the prefix cache's names and compiled paths), per request
    (RSS: KB/request)."""
    pts = [(s.requests, getattr(s, of) * scale) for s in samples[skip:]]
    if len(pts) < 2:
        return 0.0
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / var


def summary(samples: list[Sample], skip: int = 1) -> dict:
    """The figures the README reports: the slope after `skip` cycles, and the change
    in RSS, descriptors and threads after them."""
    later = samples[skip:] or samples
    return {
        "slope_kb_per_request": round(slope(samples, skip), 4),
        "blocks_per_request": round(slope(samples, skip, "blocks", 1), 4),
        "objects_per_request": round(slope(samples, skip, "objects", 1), 4),
        "traced_bytes_per_request": round(slope(samples, skip, "traced", 1), 2),
        "slope_after_cycles": skip,
        "rss_first_mb": samples[0].rss_mb,
        "rss_last_mb": samples[-1].rss_mb,
        "rss_delta_after_warmup_mb": round(samples[-1].rss_mb - later[0].rss_mb, 1),
        "fds_after_warmup": sorted({s.fds for s in later}),
        "threads_after_warmup": sorted({s.threads for s in later}),
        "errors": sum(s.errors for s in samples),
        "unanswered": sum(s.unanswered for s in samples),
        "failures": sum((Counter(s.failures) for s in samples), Counter()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=SoakSpec.requests)
    ap.add_argument("--cycle", type=int, default=SoakSpec.cycle)
    ap.add_argument("--concurrency", type=int, default=SoakSpec.concurrency)
    ap.add_argument("--quick", action="store_true", help="40,000 requests in cycles of 5,000")
    ap.add_argument("--trace", action="store_true", help="the daemon runs PYTHONTRACEMALLOC=1")
    ap.add_argument("--json", default="bench/results/soak-cpu.json")
    args = ap.parse_args()
    requests, cycle = (40_000, 5_000) if args.quick else (args.requests, args.cycle)
    spec = SoakSpec(requests=requests, cycle=cycle, concurrency=args.concurrency, trace=args.trace)
    with tempfile.TemporaryDirectory(prefix="fsd-soak-") as tmp:
        samples = soak(spec, Path(tmp))
    rows = [{**asdict(s), "kb": (s.rss_mb - samples[0].rss_mb) * 1024} for s in samples]
    console = Console()
    console.print(
        table_of(
            "daemon after each cycle, idle",
            "cycle | requests | RSS MB | vs cycle 1 KB | py blocks | py objects | fds | threads | s | errors",
            "{cycle} | {requests} | {rss_mb:.1f} | {kb:+.0f} | {blocks} | {objects} | {fds} | {threads} | {seconds} | {errors}",
            rows,
        )
    )  # fmt: skip
    figures = summary(samples)
    console.print(json.dumps(figures))
    path = write_result(
        args.json, asdict(spec), samples=[asdict(s) for s in samples], summary=figures,
        command=" ".join(["python", "bench/soak.py", *sys.argv[1:]]),
    )  # fmt: skip
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
