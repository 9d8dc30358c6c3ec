"""Fuzzed HTTP bodies against a fresh daemon: does any answer 5xx, does the daemon die?

    .venv/bin/python bench/fuzz_http.py [--count 2000] [--batch 20] [--seed 0]

The same requests as the CI fuzz test (tests/server/http_fuzz.py: random bytes, random
JSON, mutated completion and chat requests, damaged bodies, deep nesting, odd content
types and encodings), drawn by hypothesis from `--seed`, in batches of `--batch`;
then the fixed edge cases (an oversized body, 100,000 levels of nesting, ...). After
every batch a plain completion must complete. A daemon that dies is counted as a
crash and started again, so that the run goes on.
Prints a table and writes JSON (default bench/results/fuzz-http.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe_machine  # noqa: E402

from tests.server.daemon_proc import Daemon, free_port, start_daemon  # noqa: E402
from tests.server.http_fuzz import (  # noqa: E402
    DAEMON_CONFIG,
    MAX_BODY,
    Case,
    cases,
    edge_cases,
    judge,
    normal_request,
    send,
)


class Run:
    """One bench run: the daemon under test and everything counted so far."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.daemons = 0
        self.daemon = self._start()
        self.sent = 0
        self.status: Counter[str] = Counter()
        self.by_kind: dict[str, Counter[str]] = {}
        self.failures: list[dict[str, str]] = []  # every answer judged wrong (first 50 kept)
        self.wrong = 0
        self.parser_4xx = 0  # refused by aiohttp's HTTP parser before any route (text/plain)
        self.crashes = 0
        self.batches = 0
        self.normal_ok = 0
        self.normal_failed = 0

    def _start(self) -> Daemon:
        self.daemons += 1
        port = free_port()
        home = self.tmp / f"d{self.daemons}"
        home.mkdir()
        d = start_daemon(home, DAEMON_CONFIG, "--http", f"127.0.0.1:{port}")
        d.http = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        return d

    def batch(self, batch: list[Case]) -> None:
        for case in batch:
            answer = send(self.daemon.http, case)  # type: ignore[attr-defined]
            self.sent += 1
            code = str(answer.status) if answer.status else "none"
            self.status[code] += 1
            self.by_kind.setdefault(case.kind, Counter())[code] += 1
            if answer.status >= 400 and answer.content_type.startswith("text/plain"):
                self.parser_4xx += 1
            verdict = judge(answer)
            if verdict is not None:
                self.wrong += 1
                if len(self.failures) < 50:
                    body = case.body[:300].decode("utf-8", "backslashreplace")
                    self.failures.append(
                        {
                            "path": case.path,
                            "headers": str(case.headers),
                            "body": body,
                            "verdict": verdict[:500],
                        }
                    )
        self.batches += 1
        if self.daemon.proc.poll() is not None:
            self.crashes += 1
            log = self.daemon.log.read_text(errors="replace")[-4000:]
            self.failures.append(
                {"path": "", "headers": "", "body": "", "verdict": f"daemon died:\n{log}"}
            )
            self.daemon = self._start()
        if normal_request(self.daemon.http):  # type: ignore[attr-defined]
            self.normal_ok += 1
        else:
            self.normal_failed += 1

    def stop(self) -> int:
        return self.daemon.stop()


def fuzz(run: Run, count: int, batch: int, seed_value: int) -> None:
    """`count` fuzzed bodies in batches of `batch`, drawn from `seed_value`."""

    @seed(seed_value)
    @settings(
        max_examples=max(1, count // batch),
        deadline=None,
        database=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(cases(), min_size=batch, max_size=batch))
    def draw(cases_: list[Case]) -> None:
        run.batch(cases_)

    draw()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--count", type=int, default=2000, help="fuzzed bodies (edge cases extra)")
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="bench/results/fuzz-http.json")
    args = ap.parse_args()

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(Path(tmp))
        try:
            fuzz(run, args.count, args.batch, args.seed)
            fuzzed = run.sent
            for case in edge_cases(MAX_BODY):
                run.batch([case])
        finally:
            rc = run.stop()
    elapsed = time.perf_counter() - start
    five_xx = sum(n for code, n in run.status.items() if code.startswith("5"))

    console = Console()
    table = Table(title=f"fsd HTTP fuzz: {run.sent} bodies ({fuzzed} fuzzed, seed {args.seed})")
    table.add_column("bodies sent", justify="right")
    table.add_column("status codes", justify="left")
    for col in ("5xx", "wrong answers", "crashes", "normal requests completed"):
        table.add_column(col, justify="right")
    codes = ", ".join(f"{code}: {n}" for code, n in sorted(run.status.items()))
    table.add_row(
        str(run.sent),
        codes,
        str(five_xx),
        str(run.wrong),
        str(run.crashes),
        f"{run.normal_ok}/{run.batches}",
    )
    console.print(table)
    kinds = Table(title="status codes by kind of body")
    kinds.add_column("kind")
    kinds.add_column("bodies", justify="right")
    kinds.add_column("status codes")
    for kind, counts in sorted(run.by_kind.items()):
        listed = ", ".join(f"{c}: {n}" for c, n in sorted(counts.items()))
        kinds.add_row(kind, str(sum(counts.values())), listed)
    console.print(kinds)
    for failure in run.failures[:10]:
        console.print(
            f"[red]{failure['path']}[/] {failure['headers']} {failure['body'][:120]!r}: "
            f"{failure['verdict']}"
        )
    console.print(
        f"{run.parser_4xx} of the 4xx were aiohttp's text/plain refusals of a request its HTTP "
        f"parser could not take; {elapsed:.0f} s; the daemon stopped with exit status {rc}"
    )

    result = {
        "machine": describe_machine(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "settings": vars(args),
        "daemon_config": DAEMON_CONFIG,
        "bodies_sent": run.sent,
        "fuzzed_bodies": fuzzed,
        "edge_cases": run.sent - fuzzed,
        "status_codes": dict(sorted(run.status.items())),
        "status_codes_by_kind": {
            k: dict(sorted(v.items())) for k, v in sorted(run.by_kind.items())
        },
        "5xx": five_xx,
        "wrong_answers": run.wrong,
        "http_parser_4xx_text": run.parser_4xx,
        "crashes": run.crashes,
        "batches": run.batches,
        "normal_requests_completed": run.normal_ok,
        "normal_requests_failed": run.normal_failed,
        "daemon_exit_status": rc,
        "failures": run.failures,
        "seconds": round(elapsed, 1),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
