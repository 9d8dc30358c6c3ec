"""The ZeroMQ reproductions of issue P21 for bench/abuse.py: each is an attack on a
running daemon that returns its own outcome (a short line and its numbers) and stops
early once the watcher says the daemon's RSS passed its cap, or at its time cap.

The frames, the raw ZMTP peer (it reads only when told) and the bare DEALER are the
tests' own (tests/server/test_budgets.py, tests/server/daemon_proc.py).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import zmq

from fsd import protocol as P
from tests.server.daemon_proc import Daemon, raw
from tests.server.test_budgets import RawPeer, _big_submit

MIB = 1 << 20
LONG = P.Sampling(max_tokens=900, ignore_eos=True)  # a job that stays live


@dataclass
class Ctx:
    """One attack's daemon, its limits and what it reports."""

    d: Daemon
    http: str | None  # base URL of its HTTP API
    api_key: str | None
    quick: bool
    over: Any  # multiprocessing.Event: the daemon's RSS passed idle + cap
    cap_s: float  # the attack's wall-time cap
    t0: float = field(default_factory=time.monotonic)
    notes: list[str] = field(default_factory=list)  # what went wrong on the way

    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def since(self) -> float:
        """Seconds into the attack."""
        return round(time.monotonic() - self.t0, 1)

    def stopped(self) -> bool:
        """Whether the attack must stop: RSS over its cap, or out of time."""
        return self.over.is_set() or time.monotonic() - self.t0 > self.cap_s

    def hold(self, seconds: float) -> None:
        """Wait `seconds` (less once stopped)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.stopped():
            time.sleep(0.1)


def dealer(ctx: Ctx) -> zmq.Socket:
    """A DEALER that queues without bound both ways (what it sends leaves as fast as
    the daemon takes it; its unread replies stay on this side)."""
    s = raw(ctx.d)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    return s


def drain(s: zmq.Socket, wait: float) -> list[P.Reply]:
    """The replies `s` holds or receives within `wait` seconds."""
    out, end = [], time.monotonic() + wait
    while time.monotonic() < end and s.poll(200):
        while s.poll(0):
            out.append(P.decode_reply(s.recv_multipart()[-1]))
    return out


def overloaded(replies: list[P.Reply]) -> int:
    return sum(isinstance(r, P.Error) and r.code == "overloaded" for r in replies)


def frames_one(ctx: Ctx) -> dict[str, Any]:
    """(2) 200 frames of 8 MiB from one DEALER, all queued at once (as the issue's red
    team and tests/server/test_budgets.py send them: 4 buffers, never copied), then
    their replies collected (until all came, the cap, or a stop)."""
    s = dealer(ctx)
    frames = [_big_submit(f"big-{i}", 8 * MIB) for i in range(4)]
    count, sent = ctx.n(200, 40), 0
    while sent < count and not ctx.stopped():
        s.send(frames[sent % 4], copy=False)
        sent += 1
    replies: list[P.Reply] = []
    while len(replies) < sent and not ctx.stopped():
        replies += drain(s, 1.0)
    s.close()
    line = f"{sent}/{count} frames sent, {len(replies)} answered, {overloaded(replies)} overloaded"
    return {"line": line, "sent": sent, "answered": len(replies), "overloaded": overloaded(replies)}


async def _stream(http: str, key: str | None, tokens: int) -> bool:
    """One streamed HTTP completion; whether it ended whole (finish_reason, [DONE])."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": tokens, "ignore_eos": True}
    try:
        async with aiohttp.ClientSession(headers=headers) as http_session:
            url = f"{http}/v1/completions"
            async with http_session.post(url, json={**body, "stream": True}) as resp:
                lines = [line async for line in resp.content]
        return resp.status == 200 and any(b"[DONE]" in line for line in lines)
    except (TimeoutError, aiohttp.ClientError):
        return False


def frames_http(ctx: Ctx) -> dict[str, Any]:
    """(1) 40 connections each send one 8 MiB frame while 20 HTTP streams run."""
    assert ctx.http
    conns, streams = ctx.n(40, 10), ctx.n(20, 6)

    async def both() -> list[bool]:
        jobs = [
            asyncio.create_task(_stream(ctx.http or "", ctx.api_key, 200)) for _ in range(streams)
        ]
        await asyncio.sleep(0.5)  # the streams are running
        socks = _one_frame_each(ctx, conns)
        try:
            async with asyncio.timeout(max(ctx.cap_s - (time.monotonic() - ctx.t0), 5.0)):
                return list(await asyncio.gather(*jobs))
        except TimeoutError:
            return [j.done() and not j.cancelled() and j.result() for j in jobs]
        finally:
            for s in socks:
                s.close()

    failed = streams - sum(asyncio.run(both()))
    line = f"HTTP streams failed {failed}/{streams} ({conns} frames of 8 MiB)"
    return {"line": line, "streams_failed": failed, "streams": streams, "frames": conns}


def _one_frame_each(ctx: Ctx, conns: int) -> list[zmq.Socket]:
    socks = [dealer(ctx) for _ in range(conns)]
    frame = _big_submit("big", 8 * MIB)
    for s in socks:
        s.send(frame, copy=False)
    return socks


def live_jobs(ctx: Ctx, conns: int, each: int) -> list[zmq.Socket]:
    """`conns` DEALERs submitting `each` long jobs apiece (their replies queue here)."""
    socks = [dealer(ctx) for _ in range(conns)]
    for c, s in enumerate(socks):
        for i in range(each):
            if i % 1000 == 0 and ctx.stopped():
                return socks
            s.send(
                P.encode(P.Submit(req_id=f"j{c}-{i}", prompt_token_ids=[9, 9, 9], sampling=LONG))
            )
    return socks


def count_jobs(ctx: Ctx, want: int, wait: float) -> int:
    """The daemon's live jobs once it holds `want` (or after `wait` s, or on a stop)."""
    jobs, end = 0, time.monotonic() + wait
    with ctx.d.client(timeout=60.0, operator=False) as c:
        while time.monotonic() < end and not ctx.stopped():
            try:
                jobs = c.status().jobs
            except Exception as exc:  # noqa: BLE001 - a daemon too busy to answer: try again
                ctx.notes.append(f"status at {ctx.since()} s: {exc!r}"[:160])
                continue
            if jobs >= want:
                break
            time.sleep(0.5)
    return jobs


def unread_listjobs(ctx: Ctx) -> dict[str, Any]:
    """(3) 10,000 live jobs, then a client sends 1000 ListJobs and never reads."""
    conns, each = 2, ctx.n(5000, 1000)
    socks = live_jobs(ctx, conns, each)
    jobs = count_jobs(ctx, conns * each, 120.0)
    phases = {"jobs_live_s": ctx.since()}
    greedy, sent, dropped = RawPeer(ctx.d.endpoint), 0, False
    greedy.sock.settimeout(10.0)  # a daemon that stops reading does not hang the bench
    listing = P.encode(P.ListJobs())
    try:
        while sent < ctx.n(1000, 200) and not ctx.stopped():
            greedy.send(listing)
            sent += 1
    except TimeoutError:
        pass  # the daemon stopped reading this connection (without closing it)
    except OSError:
        dropped = True  # the daemon closed the connection
    phases["listed_s"] = ctx.since()
    ctx.hold(ctx.n(30, 10))
    dropped = dropped or _closed(greedy.sock)
    for s in [*socks, greedy]:
        s.close()
    line = f"{jobs} live jobs; {sent} ListJobs sent; reader dropped: {'yes' if dropped else 'no'}"
    return {"line": line, "jobs": jobs, "sent": sent, "dropped": dropped, **phases}


def _closed(sock: socket.socket, wait: float = 0.5) -> bool:
    """Whether the daemon closed `sock` (read what it holds for up to `wait` s)."""
    sock.setblocking(False)
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            if not sock.recv(1 << 20):
                return True
        except BlockingIOError:
            time.sleep(0.05)
        except OSError:
            return True
    return False


def unread_subscribers(ctx: Ctx) -> dict[str, Any]:
    """(4) Ten telemetry subscribers that never read, for 60 s, with 200 live jobs."""
    stuck = [RawPeer(ctx.d.telemetry, b"SUB") for _ in range(10)]
    for peer in stuck:
        peer.send(b"\x01")  # subscribe to everything
    socks = live_jobs(ctx, 1, 200)
    ctx.hold(ctx.n(60, 20))
    dropped = sum(_closed(p.sock) for p in stuck)
    for s in [*socks, *stuck]:
        s.close()
    return {"line": f"{dropped}/10 unread subscribers dropped", "dropped": dropped}


def many_jobs(ctx: Ctx) -> dict[str, Any]:
    """(5) Ten connections submit ~98,000 live jobs; the honest client's 2-token
    request is timed by the watcher meanwhile."""
    each = ctx.n(9800, 1000)
    socks = live_jobs(ctx, 10, each)
    sent_s = ctx.since()
    jobs = count_jobs(ctx, 10 * each, ctx.n(90, 30))
    live_s = ctx.since()
    ctx.hold(ctx.n(30, 10))
    for s in socks:
        s.close()
    line = f"{jobs} live jobs reached of {10 * each}" + (f" in {live_s} s" if jobs else "")
    return {"line": line, "jobs": jobs, "sent_s": sent_s, "jobs_live_s": live_s}


ZMQ_CASES: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "frames+http": frames_http,
    "frames": frames_one,
    "unread-listjobs": unread_listjobs,
    "unread-subs": unread_subscribers,
    "many-jobs": many_jobs,
}
