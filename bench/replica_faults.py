"""Replicas that hang, and ordinary requests that used to wait on replica steps.

    .venv/bin/python bench/replica_faults.py --before /tmp/head   # both trees
    .venv/bin/python bench/replica_faults.py                      # this tree

A daemon of two replicas (`[cluster] replicas = 2`, Ray actors on the CPU) per case:
  sigstop   four honest streams run; one replica's actor process is SIGSTOPped; a
            status is asked every 0.25 s for 15 s (its latency), and the streams' gaps
            are measured (the streams that end whole ran on the healthy replica)
  reaped    a client submits 300 long jobs and goes silent (client_timeout 3 s; 30 s
            in the other cases): the reaper aborts them beside an honest stream (its
            longest gap) and a status
  listjobs  a client sends 200 ListJobs beside an honest stream (its longest gap, and
            how long the 200 answers took)
Targets (issue P22): status within 1 s and healthy streams with no gap over 1 s while a
replica is stopped; no gap over 0.5 s beside 300 reaped jobs or 200 ListJobs.
Writes JSON (default bench/results/replica-faults-cpu.json) with the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import write_result  # noqa: E402

from fsd import protocol as P  # noqa: E402
from fsd.client import Client  # noqa: E402
from tests.server.daemon_proc import Daemon, pool_config, raw, start_daemon  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LONG = P.Sampling(max_tokens=900, ignore_eos=True)


def stream_gaps(d: Daemon, tokens: int, out: list[dict[str, Any]], stop: threading.Event) -> None:
    """One honest stream: its longest gap between chunks and how it ended."""
    try:
        with Client(d.endpoint, timeout=30.0) as c:  # a ping every 10 s: never reaped
            last, gap = time.monotonic(), 0.0
            handle = c.submit([3, 4, 5], max_tokens=tokens, ignore_eos=True)
            for _chunk in handle:
                now = time.monotonic()
                gap, last = max(gap, now - last), now
            result = handle.result(timeout=120.0)
            out.append({"gap_s": round(gap, 3), "reason": result.finish_reason})
    except Exception as exc:  # noqa: BLE001 - an error is a result
        out.append({"gap_s": None, "reason": f"{type(exc).__name__}: {exc}"[:120]})


def status_times(d: Daemon, seconds: float) -> list[float]:
    took = []
    with Client(d.endpoint, timeout=60.0) as c:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                c.status()
                took.append(time.monotonic() - t0)
            except Exception:  # noqa: BLE001
                took.append(float("inf"))
            time.sleep(0.25)
    return took


def replica_pids(d: Daemon) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "ray::ReplicaWorker" in line]


def sigstop(d: Daemon) -> dict[str, Any]:
    streams: list[dict[str, Any]] = []
    stop = threading.Event()
    threads = [threading.Thread(target=stream_gaps, args=(d, 1800, streams, stop)) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # the streams run (each for well over the 15 s below)
    pids = replica_pids(d)
    victim = pids[-1] if pids else None
    if victim is not None:
        os.kill(victim, signal.SIGSTOP)
    try:
        took = status_times(d, 15.0)
    finally:
        if victim is not None:
            with contextlib.suppress(ProcessLookupError):  # (killed and replaced)
                os.kill(victim, signal.SIGCONT)
    for t in threads:
        t.join(150)
    whole = [s["gap_s"] for s in streams if s["reason"] == "length"]
    return {"status_max_s": round(max(took), 3), "status_n": len(took), "streams": streams,
            "healthy_gap_max_s": max(whole) if whole else None, "pids": pids}  # fmt: skip


def reaped(d: Daemon) -> dict[str, Any]:
    streams: list[dict[str, Any]] = []
    stop = threading.Event()
    honest = threading.Thread(target=stream_gaps, args=(d, 300, streams, stop))
    honest.start()
    s = raw(d)
    for i in range(300):
        s.send(P.encode(P.Submit(req_id=f"gone-{i}", prompt_token_ids=[9, 9, 9], sampling=LONG)))
    time.sleep(0.5)
    s.close()  # silent from now: reaped after client_timeout
    took = status_times(d, 10.0)
    honest.join(150)
    return {"status_max_s": round(max(took), 3), "gap_s": streams[0]["gap_s"] if streams else None,
            "stream": streams}  # fmt: skip


def listjobs(d: Daemon) -> dict[str, Any]:
    streams: list[dict[str, Any]] = []
    stop = threading.Event()
    honest = threading.Thread(target=stream_gaps, args=(d, 300, streams, stop))
    honest.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    with Client(d.endpoint, timeout=120.0) as c:
        for _ in range(200):
            c.jobs()
    took = time.monotonic() - t0
    honest.join(150)
    return {"listjobs_200_s": round(took, 2), "gap_s": streams[0]["gap_s"] if streams else None,
            "stream": streams}  # fmt: skip


CASES = {"sigstop": sigstop, "reaped": reaped, "listjobs": listjobs}


def run_tree(tree: Path, only: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"tree": str(tree)}
    for name, case in CASES.items():
        if only and name not in only:
            continue
        print(f"[{tree.name}] {name} ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="fsd-replica-faults-") as tmp:
            timeout = 3.0 if name == "reaped" else 30.0  # (the honest streams send no pings)
            config = pool_config(256, 8, 10, client_timeout=timeout) + "[cluster]\nreplicas = 2\n"
            d = start_daemon(Path(tmp), config, wait=300.0, env={"PYTHONPATH": str(tree)}, cwd=tree)
            try:
                out[name] = case(d)
            finally:
                d.stop(timeout=60)
        print(f"  {out[name]}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, default=None)
    ap.add_argument("--only", default=None)
    ap.add_argument("--json", default="bench/results/replica-faults-cpu.json")
    args = ap.parse_args()
    only = args.only.split(",") if args.only else None
    runs = {}
    if args.before:
        runs["before"] = run_tree(args.before.resolve(), only)
    runs["after"] = run_tree(ROOT, only)
    command = " ".join(["python", "bench/replica_faults.py", *sys.argv[1:]])
    print(write_result(args.json, {"only": only}, command=command, **runs))


if __name__ == "__main__":
    main()
