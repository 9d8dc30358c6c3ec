"""The watcher of bench/abuse.py, in a process of its own (the attack's GIL, sockets and
memory do not slow it down): it samples the daemon's RSS and open descriptors every
0.2 s, reads its telemetry for the engine loop's longest stall, and times an honest
client: a 2-token SDK request every 0.5 s and, when the daemon serves HTTP, a 2-token
POST /v1/completions every 0.5 s.

The stall is the longest gap between two consecutive snapshots' own `time`: the
daemon stamps a snapshot on its engine loop thread (`fsd.server.publish.telemetry`) every
1 / telemetry_hz (0.1 s here), so a gap of G seconds is a loop that did not come
round for G seconds, whenever the snapshot reached this reader.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from fsd import protocol as P
from fsd.client import Client

HONEST_EVERY = 0.5  # seconds between two honest requests
HONEST_TIMEOUT = 90.0  # an honest request unanswered this long is a failure


@dataclass(frozen=True)
class Watch:
    """What the watcher watches."""

    pid: int
    endpoint: str
    telemetry: str
    http: str | None  # base URL, or None without HTTP
    api_key: str | None
    idle_mb: float
    cap_mb: float  # RSS above idle + cap_mb: the attack is told to stop


def rss_fds(pid: int) -> tuple[float, int]:
    """(RSS in MB, open descriptors) of `pid`, from /proc; (0, 0) once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024, len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        pass
    return 0.0, 0


@dataclass
class Honest:
    """One honest client's timings: latencies of answered requests, and failures."""

    took: list[float] = field(default_factory=list)
    failed: int = 0
    started: float | None = None  # the request in flight, if any

    def timed(self, call: Any) -> None:
        self.started = time.monotonic()
        try:
            call()
            self.took.append(time.monotonic() - self.started)
        except Exception:  # noqa: BLE001 - any failure of an honest request counts
            self.failed += 1
            self.took.append(time.monotonic() - self.started)
        self.started = None

    def figures(self) -> dict[str, Any]:
        """p50 and max in seconds (an unanswered request counts its wait so far)."""
        took = list(self.took)
        if self.started is not None:
            took.append(time.monotonic() - self.started)
        return {
            "n": len(took),
            "failed": self.failed + (self.started is not None),
            "p50_s": round(statistics.median(took), 3) if took else None,
            "max_s": round(max(took), 3) if took else None,
        }


class Watcher:
    """The watcher's threads and figures."""

    def __init__(self, w: Watch, stop: Any, over: Any) -> None:
        self.w, self.stop, self.over = w, stop, over
        self.peak_mb, self.fds_peak = w.idle_mb, 0
        self.stall_s, self.snapshots, self.last_snap = 0.0, 0, None
        self.stall_end = 0.0  # when the longest stall ended (the daemon's wall clock)
        self.sdk, self.web = Honest(), Honest()

    def sample(self) -> None:
        while not self.stop.is_set():
            mb, fds = rss_fds(self.w.pid)
            self.peak_mb, self.fds_peak = max(self.peak_mb, mb), max(self.fds_peak, fds)
            if mb - self.w.idle_mb > self.w.cap_mb:
                self.over.set()
            time.sleep(0.2)

    def telemetry(self) -> None:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, P.TOPIC_SNAPSHOT)
        sub.connect(self.w.telemetry)
        while not self.stop.is_set():
            if sub.poll(200):
                stamp = P.decode_snapshot(sub.recv_multipart()[-1]).time
                if self.last_snap is not None and stamp - self.last_snap > self.stall_s:
                    self.stall_s, self.stall_end = stamp - self.last_snap, stamp
                self.last_snap, self.snapshots = stamp, self.snapshots + 1
        sub.close()

    def honest_sdk(self) -> None:
        with Client(self.w.endpoint, timeout=HONEST_TIMEOUT) as c:
            while not self.stop.is_set():
                self.sdk.timed(lambda: c.complete([1, 2, 3], max_tokens=2, ignore_eos=True))
                self.stop.wait(HONEST_EVERY)

    def honest_http(self) -> None:
        body = json.dumps({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}).encode()
        headers = {"Content-Type": "application/json"}
        if self.w.api_key:
            headers["Authorization"] = f"Bearer {self.w.api_key}"

        def post() -> None:
            req = urllib.request.Request(f"{self.w.http}/v1/completions", body, headers)
            with urllib.request.urlopen(req, timeout=HONEST_TIMEOUT) as resp:
                resp.read()

        while not self.stop.is_set():
            self.web.timed(post)
            self.stop.wait(HONEST_EVERY)

    def figures(self) -> dict[str, Any]:
        last, now = self.last_snap, time.time()
        stall = max(self.stall_s, now - last) if last else None
        if last and now - last > self.stall_s:  # a loop stuck now: the stall lasts to the end
            self.stall_end = now
        return {
            "peak_mb": round(self.peak_mb, 1),
            "fds_peak": self.fds_peak,
            "stall_s": round(stall, 2) if stall is not None else None,
            "stall_end": self.stall_end,
            "snapshots": self.snapshots,
            "sdk": self.sdk.figures(),
            "http": self.web.figures() if self.w.http else None,
        }


def watch(w: Watch, stop: Any, over: Any, out: Any) -> None:
    """Run until `stop` is set, then put the figures on `out` (a multiprocessing queue);
    set `over` when the daemon's RSS passes idle + cap."""
    watcher = Watcher(w, stop, over)
    jobs = [watcher.sample, watcher.telemetry, watcher.honest_sdk]
    jobs += [watcher.honest_http] if w.http else []
    threads = [threading.Thread(target=j, daemon=True) for j in jobs]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=1.0)  # an honest request still waiting counts its wait so far
    out.put(watcher.figures())
