"""What a player learns from the daemon's telemetry while a scenario plays.

Snapshots give the KV pools over time (paper Fig. 8), the recent iterations (start,
duration: the execution part of the latency split) and the daemon's SLO; events give
each job's swap-in copies (the swapping part). With telemetry off none of this is
available and the summary says so.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from fsd import protocol as P


@dataclass
class TelemetryLog:
    """Accumulated telemetry of one play."""

    iterations: dict[float, float] = field(default_factory=dict)  # end time -> duration
    swap_in: dict[str, float] = field(default_factory=dict)  # job id -> seconds of copies
    kv: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    slo: float | None = None
    snapshots: int = 0
    events: int = 0
    _swap_begin: dict[str, float] = field(default_factory=dict)

    def add(self, msg: Any) -> None:
        if isinstance(msg, P.Snapshot):
            self.snapshots += 1
            self.slo = msg.slo.slo_per_token_latency
            for it in msg.iterations:
                self.iterations[it.start + it.duration] = it.duration
            jobs = sum(len(lv.job_ids) for lv in msg.levels)
            kv = msg.kv
            self.kv.append((msg.time, kv.device_used, kv.host_used, kv.device_total, jobs))
        elif isinstance(msg, P.Event):
            self.events += 1
            if msg.job_id is None:
                return
            if msg.kind == "swap-in-begin":
                self._swap_begin[msg.job_id] = msg.time
            elif msg.kind == "swap-in-end":
                began = self._swap_begin.pop(msg.job_id, msg.time)
                self.swap_in[msg.job_id] = self.swap_in.get(msg.job_id, 0.0) + msg.time - began

    def kv_series(self, t0: float) -> list[dict[str, float]]:
        """KV samples relative to `t0` (the play's start, wall clock)."""
        return [
            {"t": t - t0, "device_used": d, "host_used": h, "device_total": n, "jobs": j}
            for t, d, h, n, j in self.kv
        ]


async def record(client: Any, log: TelemetryLog, stop: asyncio.Event) -> None:
    """Feed `log` from an `AsyncTelemetryClient` until `stop` is set."""
    with contextlib.suppress(asyncio.CancelledError):
        while not stop.is_set():
            msg = await client.recv(timeout=0.2)
            if msg is not None:
                log.add(msg)
