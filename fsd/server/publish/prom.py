"""Prometheus metrics of the daemon, served at /metrics by the HTTP frontend.

Names follow vLLM where vLLM has the metric (running / waiting requests, KV usage
under its current and its older name, TTFT, time per output token, inter-token,
queue and end-to-end latency, per-request prompt and generation tokens, preemptions,
token and request counts), with vLLM's buckets, so existing dashboards work; fsd's
own carry the `fsd_` prefix (per-level queues, swaps and their bytes, promotions,
demotions, the next swap-in's ENST, the reserve). Every metric carries the
`model_name` label, as vLLM's do. The prefix cache's counters (vLLM's
`prefix_cache_queries` / `hits` in tokens, fsd's host hits and per-tier blocks and
evictions) mirror the engine's totals: read from each snapshot, as the swap bytes are.

Time per output token is observed per token gap, as vLLM v1 does (the same samples
as the inter-token latency, which later vLLM versions renamed it to). Queue time is
arrival to first scheduled: the job's arrival (its result) to its `start` telemetry
event (the iteration that first scheduled it), so it needs telemetry on.

Feeding is cheap and thread-safe: the telemetry publisher hands over every snapshot
and event it sends, the engine hands over every finished job, and each is only put
on a queue. The HTTP thread drains the queue (`pump`) and updates the metrics, so
the engine thread never pays for a histogram. Gauges come from the latest snapshot,
which exists only while telemetry is on (`telemetry_hz > 0`).

The metrics themselves are defined in `prom_defs` (buckets, histograms, counters)
and `prom_gauges` (the snapshot's gauges); this module feeds them.
"""

from __future__ import annotations

import queue
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from fsd import protocol as P
from fsd.engine.output import RequestOutput
from fsd.server.publish.prom_defs import EVENT_COUNTERS, RequestMetrics
from fsd.server.publish.prom_gauges import SnapshotGauges
from fsd.server.publish.prom_process import BudgetCounters, ProcessGauges

CONTENT_TYPE = CONTENT_TYPE_LATEST  # the format generate_latest writes

_PENDING_CAP = 65_536  # jobs waiting for their start event or result (one may be lost)


class MetricsCollector:
    """All metrics of one daemon in a private registry; `render()` is the /metrics body."""

    def __init__(self, model_name: str, max_model_len: int = 2048, events: bool = True) -> None:
        """`max_model_len` bounds the token-count buckets; `events`: telemetry is on, so
        `start` events come (queue time is observed only then)."""
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._events = events
        # queue time pairs a job's start event with its arrival (in its result); either
        # may come first, so each waits here for the other (bounded: one may be lost)
        self._started: OrderedDict[str, float] = OrderedDict()  # job id -> start time
        self._arrived: OrderedDict[str, float] = OrderedDict()  # job id -> arrival time
        self.requests = RequestMetrics(self.registry, model_name, max_model_len)
        self.gauges = SnapshotGauges(model_name)
        self.registry.register(self.gauges)
        self.registry.register(ProcessGauges(model_name))

    def add_collector(self, read: Callable[[], dict[str, float]]) -> None:
        """Serve the gates' budget counters `read` gives (`prom_process.BudgetCounters`)."""
        self.registry.register(BudgetCounters(self.model_name, read))

    @property
    def unpaired(self) -> int:
        """Jobs whose queue time waits for its other half (a start event or a result)."""
        return len(self._started) + len(self._arrived)

    # ---- feeding: any thread, a queue put each --------------------------------------

    def telemetry(self, topic: bytes, msg: Any) -> None:
        """A published snapshot or event (the telemetry publisher's tap)."""
        self._inbox.put(msg)

    def job_finished(self, out: RequestOutput) -> None:
        """A job's whole result, as its client gets it."""
        self._inbox.put(out)

    # ---- applying: the HTTP thread --------------------------------------------------

    def pump(self) -> None:
        """Apply everything fed since the last pump."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, P.Snapshot):
                self.gauges.update(item)
            elif isinstance(item, P.Event):
                self._event(item)
            elif isinstance(item, RequestOutput):
                self._finished(item)

    def render(self) -> bytes:
        self.pump()
        return generate_latest(self.registry)

    def _event(self, e: P.Event) -> None:
        if e.job_id is not None:
            if e.kind == "start":
                self._job_started(e.job_id, e.time)
            elif e.kind in ("finish", "abort"):
                # its result came before this event (the engine thread queues results
                # at once, events later): whatever still waits for a pair never gets one
                self._started.pop(e.job_id, None)
                self._arrived.pop(e.job_id, None)
        target = EVENT_COUNTERS.get(e.kind)
        if target is None:
            return
        name, label = target
        counter: Counter = getattr(self.requests, name)
        if label is not None:
            counter.labels(self.model_name, label).inc()
        else:
            counter.labels(self.model_name).inc()

    def _job_started(self, job_id: str, when: float) -> None:
        arrival = self._arrived.pop(job_id, None)
        if arrival is not None:
            self.requests.queue_time.labels(self.model_name).observe(max(0.0, when - arrival))
        else:
            _put_bounded(self._started, job_id, when)

    def _finished(self, out: RequestOutput) -> None:
        name, r = self.model_name, self.requests
        r.success.labels(name, out.finish_reason or "abort").inc()
        r.prompt_tokens.labels(name).inc(len(out.prompt_token_ids))
        r.generation_tokens.labels(name).inc(len(out.token_ids))
        r.request_prompt_tokens.labels(name).observe(len(out.prompt_token_ids))
        r.request_generation_tokens.labels(name).observe(len(out.token_ids))
        if out.ttft is not None:
            r.ttft.labels(name).observe(max(0.0, out.ttft))
        if out.latency is not None and out.token_ids:
            r.e2e.labels(name).observe(max(0.0, out.latency))
        if self._events:
            start = self._started.pop(out.request_id, None)
            if start is not None:
                r.queue_time.labels(name).observe(max(0.0, start - out.arrival_time))
            elif out.first_token_time is not None:  # it ran, so its start event is on its way
                _put_bounded(self._arrived, out.request_id, out.arrival_time)
        itl, tpot = r.itl.labels(name), r.tpot.labels(name)
        times = out.token_times
        for prev, cur in zip(times, times[1:], strict=False):
            gap = max(0.0, cur - prev)
            itl.observe(gap)
            tpot.observe(gap)


def _put_bounded(table: OrderedDict[str, float], key: str, value: float) -> None:
    """Remember `key`, forgetting the oldest entry past _PENDING_CAP (a lost event)."""
    table[key] = value
    if len(table) > _PENDING_CAP:
        table.popitem(last=False)
