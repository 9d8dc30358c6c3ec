"""The HTTP and descriptor reproductions of issue P21 for bench/abuse.py: slow HTTP
peers (unfinished heads, near-complete 8 MiB bodies) and idle TCP connections past the
daemon's open-files limit. Each returns its outcome: how many connections the daemon
closed and when, the daemon's CPU seconds and log growth while its table is full.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from abuse_cases import Ctx

BODY = 8 << 20  # the default max_frame_bytes: the largest body a request may have
FD_SOFT = 1024  # the open-files soft limit of the machine


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def head(key: str | None) -> bytes:
    """A request head without its final blank line (the API key's header with it)."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth
    ).encode()


async def _held(port: int, payload: bytes, hold: float, seen: Counter, t0: float) -> float:
    """Connect, write `payload`, then wait up to `hold` s for the daemon to answer and
    close; tallies the answer's status (or "closed", "held" if still open, "reset");
    returns when it was closed (0: it was not)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    answer, kind = b"", "held"
    try:
        async with asyncio.timeout(hold):
            w.write(payload)
            await w.drain()
            answer = await r.read()  # until the daemon closes
            kind = "closed"
    except TimeoutError:
        pass
    except ConnectionError:
        kind = "reset"
    w.close()
    if answer.startswith(b"HTTP/"):
        kind = answer.split(b" ", 2)[1].decode()
    seen[kind] += 1
    return 0.0 if kind == "held" else time.monotonic() - t0


def slow_http(ctx: Ctx) -> dict[str, Any]:
    """(6) 1000 unfinished heads and 100 bodies that declare 8 MiB and send all but
    their last byte, held 60 s."""
    assert ctx.http
    port = int(ctx.http.rsplit(":", 1)[1])
    heads, bodies = ctx.n(1000, 200), ctx.n(100, 20)
    hold = ctx.n(60, 20)
    near = head(ctx.api_key) + f"Content-Length: {BODY}\r\n\r\n".encode() + b"x" * (BODY - 1)
    seen: Counter = Counter()

    async def attack() -> list[float]:
        t0 = time.monotonic()
        jobs = [_held(port, head(ctx.api_key), hold, seen, t0) for _ in range(heads)]
        jobs += [_held(port, near, hold, seen, t0) for _ in range(bodies)]
        return list(await asyncio.gather(*jobs))

    closed = [t for t in asyncio.run(attack()) if t]
    last = max(closed, default=0.0)
    line = (
        f"{len(closed)}/{heads + bodies} closed by the daemon within {hold} s"
        + (f" (last at {last:.1f} s)" if closed else "")
        + f"; {dict(seen)}"
    )
    return {"line": line, "closed": len(closed), "of": heads + bodies, "answers": dict(seen),
            "last_closed_s": round(last, 1)}  # fmt: skip


def soft_limit() -> None:
    """In the daemon's child: the issue's soft open-files limit, the hard one kept."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_SOFT, hard))


def hard_limit() -> None:
    """In the daemon's child: soft = hard = FD_SOFT (the daemon cannot raise it)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_SOFT, FD_SOFT))


def fd_flood(ctx: Ctx) -> dict[str, Any]:
    """(7) 1100 idle TCP connections to the HTTP port, held 20 s: the daemon's CPU
    seconds and log meanwhile, whether a new connection is refused, and served after."""
    assert ctx.http
    port = int(ctx.http.rsplit(":", 1)[1])
    log_before = ctx.d.log.stat().st_size
    cpu0 = cpu_seconds(ctx.d.proc.pid)
    conns, unconnected = [], 0
    for _ in range(1100):
        if unconnected >= 10 or ctx.stopped():  # the backlog is full: no use waiting more
            unconnected = 1100 - len(conns)
            break
        try:
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            unconnected += 1  # the daemon's listen backlog is full
    t0 = time.monotonic()
    ctx.hold(ctx.n(20, 10))
    spent, held = cpu_seconds(ctx.d.proc.pid) - cpu0, time.monotonic() - t0
    for s in conns:
        s.close()
    served = _served_after(port)
    text = ctx.d.log.read_bytes()[log_before:]
    tracebacks = text.count(b"Traceback")
    line = (
        f"CPU {spent:.1f} s in {held:.0f} s; log +{len(text) / 1e6:.2f} MB, {tracebacks} tracebacks; "
        f"{unconnected}/1100 could not connect; served after: {served}"
    )
    return {"line": line, "cpu_s": round(spent, 2), "held_s": round(held, 1),
            "log_mb": round(len(text) / 1e6, 2), "tracebacks": tracebacks,
            "unconnected": unconnected, "served_after": served}  # fmt: skip


def _served_after(port: int, wait: float = 30.0) -> str:
    """How long a new HTTP connection took to be answered once the idle ones closed."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(12).startswith(b"HTTP/1.1"):
                    return f"{time.monotonic() - t0:.2f} s"
        except OSError:
            time.sleep(0.2)
    return f"no (> {wait:.0f} s)"


# name: (attack, preexec of the daemon's child, with HTTP)
NET_CASES: dict[str, tuple[Callable[[Ctx], dict[str, Any]], Callable[[], None] | None]] = {
    "slow-http": (slow_http, None),
    "fds (soft 1024)": (fd_flood, soft_limit),
    "fds (hard 1024)": (fd_flood, hard_limit),
}
