"""Abuse: the reproductions of issue P21 as a resource bench, before and after.

    .venv/bin/python bench/abuse.py --before /work/wt-before   # both trees, the issue's counts
    .venv/bin/python bench/abuse.py --quick                     # this tree, smaller counts
    .venv/bin/python bench/abuse.py --only frames,slow-http --tree PATH --json PATH

Each scenario gets a fresh daemon (`fsd start --foreground`, the tiny model, a small
KV pool, telemetry at 10 Hz, the HTTP API on) of the tree under test: started in that
tree with PYTHONPATH=tree, so its own `fsd` is imported (checked: the daemon's working
folder, and where `import fsd` resolves there); the bench's clients are this tree's
(protocol v2 both). Its idle RSS is read, then the attack runs with bounded counts
while a watcher process (bench/abuse_probe.py) samples RSS and descriptors every
0.2 s, takes the engine loop's longest stall from its telemetry snapshots and times an
honest client (a 2-token SDK request every 0.5 s, and over HTTP). An attack stops
early once RSS passes idle + --cap-mb (recorded as "> cap") or at its time cap.

Scenarios (issues P21's and P22's red teams; the counts of --quick in brackets):
  frames+http      40 [10] connections send one 8 MiB frame each while 20 [6] HTTP streams run
  frames           200 [40] frames of 8 MiB from one DEALER
  unread-listjobs  10,000 [2,000] live jobs; a client sends 1000 [200] ListJobs, never reads
  unread-subs      10 telemetry subscribers that never read, 60 [20] s, 200 live jobs
  many-jobs        10 connections submit 98,000 [10,000] live jobs
  slow-http        1000 [200] unfinished heads + 100 [20] near-complete 8 MiB bodies, 60 [20] s
                   (an API key configured, and sent)
  fds (soft 1024)  1100 idle TCP connections, the daemon's soft open-files limit 1024
  fds (hard 1024)  the same with soft = hard = 1024 (the daemon cannot raise it)
  state            the state folder's planted files and links (bench/abuse_state.py)
  sub-flood        3 telemetry connections send 200 subscriptions of 60 KB each, then close
  cmd-flood        50 request connections send 100 SUBSCRIBE commands of 60 KB each
  idle-hoard       4,096 [1,024] request connections handshake and say nothing (as nobody)
  idle-subs        the same on the telemetry endpoint
  curve-cycle      a CURVE daemon; 4,096 [1,024] keyless peers greet and stall, reopening

Targets (P21): RSS within 200 MB of idle, an honest request within 2 s (5 s under the
fd and frame floods), nothing written through a link, nothing signalled. (P22):
subscription floods within 20 MB a connection and freed on close; with the slots
hoarded the operator's status within 1 s and a newcomer within 2 s, 5 of 5 times.
Writes JSON (default bench/results/abuse-cpu.json) with the machine and both commits.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from abuse_cases import ZMQ_CASES, Ctx  # noqa: E402
from abuse_net import NET_CASES, cpu_seconds  # noqa: E402
from abuse_probe import Watch, rss_fds, watch  # noqa: E402
from abuse_report import markdown, table, targets  # noqa: E402
from abuse_slots import SLOT_CASES  # noqa: E402
from abuse_state import state_outcomes  # noqa: E402
from machine import write_result  # noqa: E402

from tests.server.daemon_proc import Daemon, free_port, pool_config, start_daemon  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "abuse-bench-key"
CAP_S = {"frames+http": 90, "frames": 120, "unread-listjobs": 150, "unread-subs": 90,
         "many-jobs": 180, "slow-http": 120, "fds (soft 1024)": 60, "fds (hard 1024)": 60,
         "sub-flood": 30, "cmd-flood": 60, "idle-hoard": 120, "idle-subs": 120,
         "curve-cycle": 180}  # fmt: skip
Attack = Callable[[Ctx], dict[str, Any]]


def cases() -> dict[str, tuple[Attack, Callable[[], None] | None]]:
    """Every daemon scenario: its attack and what the daemon's child runs before exec."""
    zmq_cases = {**ZMQ_CASES, **SLOT_CASES}
    return {**{k: (v, None) for k, v in zmq_cases.items()}, **NET_CASES}


def commit_of(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def tree_env(tree: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(tree)}


def check_tree(tree: Path) -> str:
    """Where `import fsd` resolves for a daemon started in `tree` (it must be there)."""
    got = subprocess.run([sys.executable, "-c", "import fsd; print(fsd.__file__)"], cwd=tree,
                         env={**os.environ, **tree_env(tree)}, capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    if not Path(got).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"a daemon in {tree} would import {got}")
    return got


def start(tree: Path, tmp: Path, name: str, preexec: Callable[[], None] | None) -> Daemon:
    """A fresh daemon of `tree` for scenario `name` (the HTTP API on, a key for slow-http)."""
    port = free_port()
    extra = {"http_api_key": API_KEY} if name == "slow-http" else {}
    config = pool_config(64, 8, 10, **extra)
    d = start_daemon(tmp, config, "--http", f"127.0.0.1:{port}", env=tree_env(tree), cwd=tree,
                     preexec=preexec)  # fmt: skip
    d.http = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    cwd = os.readlink(f"/proc/{d.proc.pid}/cwd")
    if Path(cwd).resolve() != tree.resolve():
        d.stop(timeout=10)
        raise RuntimeError(f"the daemon runs in {cwd}, not {tree}")
    return d


def settle(d: Daemon) -> None:
    """One honest request (the first one's imports and buffers), then 2 s of quiet."""
    with d.client(timeout=120.0, operator=False) as c:
        c.complete([1, 2, 3], max_tokens=2, ignore_eos=True)
    time.sleep(2.0)


def attack(d: Daemon, name: str, fn: Attack, quick: bool, cap_mb: float) -> dict[str, Any]:
    """Run one attack under the watcher; the watcher's figures, the outcome, CPU and log."""
    spawn = mp.get_context("spawn")
    stop, over, out = spawn.Event(), spawn.Event(), spawn.Queue()
    idle_mb, fds_idle = rss_fds(d.proc.pid)
    key = API_KEY if name == "slow-http" else None
    w = Watch(d.proc.pid, d.endpoint, d.telemetry, d.http, key, idle_mb, cap_mb)  # type: ignore[attr-defined]
    watcher = spawn.Process(target=watch, args=(w, stop, over, out), daemon=True)
    watcher.start()
    time.sleep(3.0)  # the watcher is up (its imports) and has a baseline of snapshots
    log0, cpu0, t0, wall0 = (
        d.log.stat().st_size,
        cpu_seconds(d.proc.pid),
        time.monotonic(),
        time.time(),
    )
    ctx = Ctx(d, d.http, key, quick, over, CAP_S[name] / (2 if quick else 1))  # type: ignore[attr-defined]
    try:
        outcome = fn(ctx)
    except Exception as exc:  # noqa: BLE001 - an attack that broke is an outcome too
        outcome = {"line": f"attack error: {exc!r}"[:200]}
    outcome["notes"] = ctx.notes[-5:]
    wall = time.monotonic() - t0
    stop.set()
    figures = out.get(timeout=120)
    end = figures.pop("stall_end")  # the longest stall's end, in seconds into the attack
    figures["stall_end_s"] = round(end - wall0, 1) if end else None
    watcher.join(timeout=10)
    time.sleep(2.0)
    after_mb, fds_after = rss_fds(d.proc.pid)
    log = d.log.read_bytes()[log0:]
    return {
        "idle_mb": round(idle_mb, 1), "fds_idle": fds_idle, **figures,
        "capped": over.is_set(), "after_mb": round(after_mb, 1), "fds_after": fds_after,
        "cpu_s": round(cpu_seconds(d.proc.pid) - cpu0, 1), "wall_s": round(wall, 1),
        "log_lines": log.count(b"\n"), "log_mb": round(len(log) / 1e6, 2), "outcome": outcome,
    }  # fmt: skip


def run_tree(tree: Path, only: list[str] | None, quick: bool, cap_mb: float) -> dict[str, Any]:
    """Every scenario (or `only` those) against daemons of `tree`."""
    result: dict[str, Any] = {"tree": str(tree), "commit": commit_of(tree),
                              "imports": check_tree(tree), "scenarios": {}}  # fmt: skip
    for name, (fn, preexec) in cases().items():
        if only and name not in only:
            continue
        print(f"[{tree.name}] {name} ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="fsd-abuse-") as tmp:
            d = start(tree, Path(tmp), name, preexec)
            try:
                settle(d)
                row = attack(d, name, fn, quick, cap_mb)
            finally:
                d.stop(timeout=20.0)
        print(f"  {row['outcome']['line']}; peak +{row['peak_mb'] - row['idle_mb']:.0f} MB, "
              f"stall {row['stall_s']} s, SDK max {row['sdk']['max_s']} s", flush=True)  # fmt: skip
        result["scenarios"][name] = row
    if not only or "state" in only:
        print(f"[{tree.name}] state ...", flush=True)
        result["state"] = state_outcomes(tree)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the fsd tree under test (after)")
    ap.add_argument("--before", type=Path, default=None, help="a tree to run first (before)")
    ap.add_argument("--quick", action="store_true", help="smaller counts, half the time caps")
    ap.add_argument("--only", default=None, help="comma-separated scenario names (and 'state')")
    ap.add_argument("--cap-mb", type=float, default=2048.0, help="stop an attack past idle + this")
    ap.add_argument("--json", default="bench/results/abuse-cpu.json")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    only = args.only.split(",") if args.only else None
    runs = {}
    if args.before:
        runs["before"] = run_tree(args.before.resolve(), only, args.quick, args.cap_mb)
    runs["after"] = run_tree(args.tree.resolve(), only, args.quick, args.cap_mb)
    console = Console(width=200)
    console.print(table(runs, args.cap_mb))
    met = targets(runs["after"], args.cap_mb)
    console.print(met)
    settings = {"quick": args.quick, "cap_mb": args.cap_mb, "only": only}
    command = " ".join(["python", "bench/abuse.py", *sys.argv[1:]])
    path = write_result(args.json, settings, command=command, **runs, targets=met,
                        markdown=markdown(runs, args.cap_mb, command))  # fmt: skip
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
