"""Telemetry: snapshots of the scheduler's state and events, published on PUB.

The snapshot is read on the engine thread between iterations (the state is only
consistent there) into plain structs; encoding and sending happen on a publisher
thread so the engine loop pays only for the read. Levels leave the engine 1-based
(`LevelInfo.index`, `JobInfo.level`: 1 = Q1), the scheduler's own count plus one.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.engine.events import EngineEvent, wire_level
from fsd.engine.face_protocol import Face
from fsd.engine.output import IterationStats
from fsd.engine.views import EngineSnapshot, kv_info
from fsd.metrics import SLOWindow
from fsd.sched.scheduler import SchedulerStats

EVENT_FLUSH_S = 0.05  # longest an event waits before it is published


def sched_info(stats: SchedulerStats) -> P.SchedInfo:
    """What the scheduler learned: the live cost scale and the output-length distribution."""
    learned = stats.learned
    return P.SchedInfo(
        live_cost=stats.live_cost,
        live_cost_samples=stats.live_cost_samples,
        learned=None
        if learned is None
        else P.LearnedInfo(
            samples=learned.samples,
            ready=learned.ready,
            mean=learned.mean,
            quantiles=[(float(q), int(n)) for q, n in learned.quantiles],
            by_prompt=[(int(p), int(c), int(m)) for p, c, m in learned.by_prompt],
        ),
    )


def build_snapshot(
    face: Face, slo: SLOWindow, seq: int, now: float, with_jobs: bool = True
) -> P.Snapshot:
    """The observable state of the engine at `now`; the job table only if `with_jobs`.

    It reads the scheduler and the block pools only through their `stats()`, so a
    field added there reaches the wire without an edit here.
    """
    return wire_snapshot(face.snapshot(now, with_jobs), slo, seq)


def wire_snapshot(snap: EngineSnapshot, slo: SLOWindow, seq: int) -> P.Snapshot:
    """The engine's snapshot as telemetry publishes it, with the SLO window's stats."""
    stats, now = snap.sched, snap.time
    config = _config_dict(snap.config)
    config["effective"] = {
        "policy": stats.policy,
        "quanta": list(stats.quanta),
        "starve_limit": stats.starve_limit,
        "starve_limit_waiting": stats.starve_limit_waiting,
    }
    return P.Snapshot(
        time=now,
        seq=seq,
        policy=stats.policy,
        levels=[
            P.LevelInfo(index=wire_level(lv.index), quantum=lv.quantum, job_ids=list(lv.job_ids))
            for lv in stats.levels
        ],
        jobs=snap.jobs,
        jobs_time=now if snap.jobs is not None else None,
        kv=kv_info(snap),
        iterations=[_iteration_info(it) for it in snap.iterations],
        slo=P.SLOInfo(**slo.stats(now)),
        config=config,
        sched=sched_info(stats),
        prefix=snap.prefix,
        replicas=snap.replicas,
        routes=snap.routes,
    )


def _iteration_info(it: IterationStats) -> P.IterationInfo:
    """One recent engine iteration as telemetry shows it."""
    return P.IterationInfo(
        start=it.start,
        duration=it.duration,
        batch_size=it.batch_size,
        prefill_tokens=it.prefill_tokens,
        decode_tokens=it.decode_tokens,
    )


@functools.lru_cache(maxsize=8)
def _config_dict_cached(config: Any) -> dict[str, Any]:
    return config.to_dict()


def _config_dict(config: Any) -> dict[str, Any]:
    """The live config as a dict; it changes only on retune, so it is built once per value."""
    return dict(_config_dict_cached(config))


class JobTablePacer:
    """Decides which snapshots carry the job table.

    Reading the table costs the engine thread a few microseconds per job: 40 ms at
    10k jobs, which at 10 Hz would take 40% of the loop. The table is sent when the
    time since the last one is at least its last cost divided by `budget`, so its
    share of wall time stays under `budget` whatever the job count; small tables
    still go out in every snapshot.
    """

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.last_time = -1e18
        self.last_cost = 0.0

    def due(self, now: float) -> bool:
        return now - self.last_time >= self.last_cost / self.budget

    def sent(self, now: float, cost: float) -> None:
        self.last_time = now
        self.last_cost = cost


def wire_event(e: EngineEvent) -> P.Event:
    return P.Event(time=e.time, kind=e.kind, job_id=e.job_id, detail=e.detail)


class TelemetryPump:
    """The loop's telemetry duty: events in batches, snapshots every 1 / telemetry_hz."""

    def __init__(
        self, face: Face, slo: SLOWindow, cfg: ServerConfig, publisher: Publisher
    ) -> None:
        self.face = face
        self.slo = slo
        self.publisher = publisher
        self.enabled = cfg.telemetry_hz > 0
        self._period = 1.0 / cfg.telemetry_hz if self.enabled else 0.0
        self._job_pacer = JobTablePacer(cfg.telemetry_job_budget)
        self._snap_seq = 0
        self._next_snapshot = 0.0
        self._events: list[EngineEvent] = []  # engine events not yet handed to the publisher
        self._next_events = 0.0
        # in-process readers of every batch of engine events, telemetry on or off (the
        # log's stats line counts swaps): called on the engine thread, so each is quick
        self.taps: list[Callable[[list[EngineEvent]], None]] = []

    def wake_time(self) -> float:
        """When the next snapshot, or the waiting events' batch, is due (wall time)."""
        wake = self._next_snapshot
        if self._events:  # events waiting for their batch to go out
            wake = min(wake, self._next_events)
        return wake

    def tick(self) -> None:
        """Take the engine's events; publish what is due (nothing when telemetry is off)."""
        events = self.face.drain_events()
        for tap in self.taps:
            tap(events)
        now = time.time()
        if self.enabled:
            # events go out in batches at most every 50 ms: each hand-off to the
            # publisher thread costs the engine thread GIL time, more than the events
            self._events.extend(events)
            if self._events and (now >= self._next_events or len(self._events) >= 512):
                self.publisher.publish_all(P.TOPIC_EVENT, self._events, wire_event)
                self._events = []
                self._next_events = now + EVENT_FLUSH_S
        if self.enabled and now >= self._next_snapshot:
            self._snap_seq += 1
            with_jobs = self._job_pacer.due(now)
            snap = build_snapshot(self.face, self.slo, self._snap_seq, now, with_jobs)
            if with_jobs:
                self._job_pacer.sent(now, time.time() - now)
            self.publisher.publish(P.TOPIC_SNAPSHOT, snap)
            self._next_snapshot = now + self._period

    def flush(self) -> None:
        """Hand the events still waiting to the publisher (before it closes)."""
        if self._events:
            self.publisher.publish_all(P.TOPIC_EVENT, self._events, wire_event)
            self._events = []


class Publisher:
    """Owns the PUB socket on its own thread; `publish` never blocks the engine."""

    def __init__(
        self, ctx: zmq.Context, endpoint: str, configure: Any = None, tune: Any = None
    ) -> None:
        """Bind `endpoint` (the telemetry gate's private path, `fsd.server.transport.endpoints`);
        `configure` sets CURVE up, `tune` the socket's queues."""
        # an item is one message, or one iteration's events with their converter
        self._queue: queue.Queue[tuple[bytes, Any, Callable[[Any], msgspec.Struct] | None] | None]
        self._queue = queue.Queue(maxsize=1024)
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 10_000)
        if tune is not None:
            tune(self.sock)
        if configure is not None:
            configure(self.sock)
        self.sock.bind(endpoint)
        self.dropped = 0
        # in-process readers of every message sent (the /metrics collector); called on
        # the publisher's thread, so each must be quick (a queue put)
        self.taps: list[Callable[[bytes, msgspec.Struct], None]] = []
        self._thread = threading.Thread(target=self._run, name="fsd-telemetry", daemon=True)
        self._thread.start()

    def publish(self, topic: bytes, msg: msgspec.Struct) -> None:
        self._put((topic, msg, None))

    def publish_all(
        self, topic: bytes, items: list[Any], convert: Callable[[Any], msgspec.Struct]
    ) -> None:
        """Publish `convert(item)` for each item, converted on the publisher's thread.

        One queue put per batch, not per message: each put wakes the publisher, and
        with dozens of events per iteration the wake-ups cost the engine thread more
        (GIL hand-offs) than the events themselves.
        """
        if items:
            self._put((topic, items, convert))

    def _put(self, item: tuple[bytes, Any, Callable[[Any], msgspec.Struct] | None]) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:  # a slow network must not slow the engine
            self.dropped += 1

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            topic, payload, convert = item
            for msg in map(convert, payload) if convert else (payload,):
                self.sock.send_multipart([topic, P.encode(msg)])
                for tap in self.taps:
                    tap(topic, msg)
        self.sock.close(linger=0)

    def close(self, timeout: float = 1.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
