"""Fuzz the daemon's ZeroMQ protocol: N hypothesis-generated messages, zero crashes wanted.

    .venv/bin/python bench/fuzz_zmq.py [--count 10000] [--batch 100] [--seed 0]
    .venv/bin/python bench/fuzz_zmq.py --count 0 --identity-ops 10000 --sockets 500

The identity fuzzer (tests/server/fuzz_identity.py) runs after the frames in a fresh
daemon: peers choosing, reusing and colliding routing ids beside honest SDK clients;
zero leaks, zero honest jobs cut short and a live daemon wanted (JSON default
bench/results/fuzz-identity.json).

A real daemon (tiny model, small limits so that oversize frames are cheap); messages
from tests/server/fuzz_frames.py in batches on fresh connections; after each batch
the daemon must still be alive and complete a normal request (fuzzed retunes are put
back first). Prints a table and writes JSON (default bench/results/fuzz-zmq.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from machine import describe_machine  # noqa: E402

from tests.server.daemon_proc import Daemon, start_daemon  # noqa: E402
from tests.server.fuzz_frames import FuzzStats, fire, frames, settings_of  # noqa: E402
from tests.server.fuzz_identity import IdentityFuzzer  # noqa: E402
from tests.server.test_protocol_fuzz import CONFIG, MAX_FRAME  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=10_000, help="messages to send")
    ap.add_argument("--batch", type=int, default=100, help="messages per connection")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/fuzz-zmq.json"))
    ap.add_argument("--identity-ops", type=int, default=10_000, help="0 skips the identity fuzzer")
    ap.add_argument("--sockets", type=int, default=500, help="identity fuzzer's sockets")
    ap.add_argument("--identity-out", type=Path, default=Path("bench/results/fuzz-identity.json"))
    args = ap.parse_args()
    if args.count > 0:
        frames_phase(args)
    if args.identity_ops > 0:
        identity_phase(args)


@contextmanager
def phase_daemon(end: dict[str, Any]) -> Iterator[Daemon]:
    """A fresh daemon for one phase; after it, `end` holds whether the daemon was still
    alive, its exit code and the phase's seconds."""
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        d = start_daemon(Path(tmp), CONFIG)
        try:
            yield d
            end["alive"] = d.proc.poll() is None
        finally:
            end["code"] = d.stop()
    end["seconds"] = time.time() - start


def report(result: dict[str, Any], title: str, keys: tuple[str, ...], out: Path) -> Table:
    """Write `result` to `out` with the machine and the command first; the table of the
    figures `keys` names (a phase adds its own rows before printing it)."""
    command = "bench/fuzz_zmq.py " + " ".join(sys.argv[1:])
    head = {"machine": describe_machine(torch.device("cpu")), "command": command}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(head | result, indent=2) + "\n")
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in keys:
        table.add_row(key, str(result[key]))
    return table


def identity_phase(args: argparse.Namespace) -> None:
    """Chosen, reused and colliding routing ids (tests/server/fuzz_identity.py)."""
    end: dict[str, Any] = {}
    with phase_daemon(end) as d:
        fuzzer = IdentityFuzzer(d.endpoint, args.sockets, args.seed, d.token, d.telemetry)
        stats = fuzzer.run(args.identity_ops)
    alive, code = end["alive"], end["code"]
    result = {
        "sockets": args.sockets,
        **stats.as_dict(),
        "daemon_alive": alive,
        "daemon_exit_code": code,
        "seconds": round(end["seconds"], 1),
    }
    title = f"identity fuzz: {stats.ops} operations over {args.sockets} sockets"
    keys = ("ops", "connects", "closes", "replies", "leak_count", "honest_jobs", "daemon_alive",
            "daemon_exit_code", "seconds")  # fmt: skip
    table = report(result, title, keys, args.identity_out)
    table.add_row("honest jobs cut short", str(len(stats.honest_bad)))
    Console().print(table)
    print(f"wrote {args.identity_out}")
    if stats.leaks or stats.honest_bad or not alive or code != 0:
        raise SystemExit(1)


def frames_phase(args: argparse.Namespace) -> None:
    """Hypothesis-generated frames in batches on fresh connections."""
    stats = FuzzStats()
    failures: list[str] = []
    end: dict[str, Any] = {}
    with phase_daemon(end) as d:

        @seed(args.seed)
        @settings(
            max_examples=args.count // args.batch,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(batch=st.lists(frames(MAX_FRAME), min_size=args.batch, max_size=args.batch))
        def one_batch(batch: list) -> None:
            with d.client() as op:
                original = settings_of(op.retune(policy=op.status().policy))
                fire(d.endpoint, batch, d.token, stats)
                if d.proc.poll() is not None:
                    failures.append("the daemon died")
                    raise SystemExit("the daemon died:\n" + d.log.read_text()[-3000:])
                op.retune(**original)
                op.undrain()
                done = op.complete([1, 2, 3], max_tokens=4, ignore_eos=True)
                if len(done.token_ids) != 4:
                    failures.append(f"a normal request ended {done.finish_reason}")
                stats.checks += 1

        one_batch()
    code = end["code"]
    result = {
        "messages": stats.messages,
        "replies": stats.replies,
        "undecodable_replies": stats.undecodable_replies,
        "normal_requests_completed": stats.checks,
        "batches": args.count // args.batch,
        "crashes": int(not end["alive"]) + len(failures),
        "daemon_exit_code": code,
        "reply_codes": dict(stats.codes.most_common()),
        "seconds": round(end["seconds"], 1),
    }
    title = f"ZeroMQ fuzz: {stats.messages} messages in {end['seconds']:.0f} s"
    keys = ("messages", "replies", "undecodable_replies", "normal_requests_completed",
            "batches", "crashes", "daemon_exit_code")  # fmt: skip
    table = report(result, title, keys, args.out)
    for code_name, n in stats.codes.most_common(12):
        table.add_row(f"  reply {code_name}", str(n))
    Console().print(table)
    print(f"wrote {args.out}")
    if result["crashes"] or stats.undecodable_replies or code != 0:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
