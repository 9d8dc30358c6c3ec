"""Slow HTTP peers against a real daemon (issue P21, item 2): 1000 connections that
never finish their head and 100 that declare an 8 MiB body and send all but its last
byte. The daemon's RSS stays within 200 MB of idle, every such connection is closed
after its deadline, and an honest request is answered meanwhile.

`python -m tests.server.test_http_slow_peers` runs it with the default deadlines and
prints the figures (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.server.daemon_proc import Daemon, free_port, start_daemon

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
BODY = 8 << 20  # the default max_frame_bytes: the largest body a request may have


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@dataclass
class Figures:
    idle_mb: float = 0.0
    peak_mb: float = 0.0
    honest_s: list[float] = field(default_factory=list)
    honest_status: list[int] = field(default_factory=list)
    closed_s: float = 0.0  # when the last slow connection was closed
    answers: dict[str, int] = field(default_factory=dict)  # first word of each answer


async def _honest(port: int) -> tuple[int, float]:
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode()
    start = time.monotonic()
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(HEAD + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    line = await asyncio.wait_for(r.readline(), 60)
    w.close()
    return int(line.split()[1]), time.monotonic() - start


async def _slow(port: int, payload: bytes, limit: float, fig: Figures, t0: float) -> None:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(payload)
    answer = b""
    try:
        async with asyncio.timeout(limit):
            await w.drain()
            answer = await r.read()  # until the server closes
    except ConnectionError:
        pass
    word = (answer.split(b" ")[1:2] or [b"closed"])[0].decode()
    fig.answers[word] = fig.answers.get(word, 0) + 1
    fig.closed_s = max(fig.closed_s, time.monotonic() - t0)
    w.close()


async def attack(d: Daemon, port: int, limit: float) -> Figures:
    """The two floods at once; an honest request each second; RSS sampled."""
    fig = Figures(idle_mb=rss_mb(d.proc.pid))
    t0 = time.monotonic()
    near = HEAD + f"Content-Length: {BODY}\r\n\r\n".encode() + b"x" * (BODY - 1)
    tasks = [asyncio.create_task(_slow(port, HEAD, limit, fig, t0)) for _ in range(1000)]
    tasks += [asyncio.create_task(_slow(port, near, limit, fig, t0)) for _ in range(100)]
    while not all(t.done() for t in tasks):
        fig.peak_mb = max(fig.peak_mb, rss_mb(d.proc.pid))
        status, took = await _honest(port)
        fig.honest_status.append(status)
        fig.honest_s.append(took)
        await asyncio.sleep(1.0)
    await asyncio.gather(*tasks)
    fig.peak_mb = max(fig.peak_mb, rss_mb(d.proc.pid))
    return fig


def run_attack(tmp: Path, config: str, limit: float) -> Figures:
    port = free_port()
    d = start_daemon(tmp, config, "--http", f"127.0.0.1:{port}")
    try:
        asyncio.run(_honest(port))  # warm: the first request's imports and buffers
        return asyncio.run(attack(d, port, limit))
    finally:
        assert d.stop() == 0


@pytest.mark.slow
def test_slow_peers_hold_neither_connections_nor_memory(tmp_path: Path):
    config = "[server]\nhttp_header_timeout = 2.0\nhttp_body_timeout = 4.0\n"
    fig = run_attack(tmp_path, config, limit=60.0)
    # heads: closed without an answer; bodies: 12 fit the budget's large share (96 MiB)
    # and time out (408), the rest are refused (503; a few reset while still sending)
    assert sum(fig.answers.values()) == 1100 and fig.answers.get("closed", 0) >= 1000
    assert fig.answers.get("408", 0) >= 1 and fig.answers.get("503", 0) >= 1
    assert fig.closed_s < 40  # deadlines 2 s and 4 s, a 503's lingering 10 s: all closed
    assert fig.peak_mb - fig.idle_mb < 200
    assert set(fig.honest_status) == {200}
    assert max(fig.honest_s) < 10  # generous: 2 s on a quiet machine


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        f = run_attack(Path(tmp), "", limit=120.0)
    print(
        f"idle RSS {f.idle_mb:.0f} MB, peak {f.peak_mb:.0f} MB (+{f.peak_mb - f.idle_mb:.0f}); "
        f"answers {f.answers}; last slow connection closed after {f.closed_s:.1f} s; "
        f"honest requests {f.honest_status}, slowest {max(f.honest_s):.2f} s",
        file=sys.stderr,
    )
