"""Prometheus metrics of the daemon, served at /metrics by the HTTP frontend.

Names follow vLLM where vLLM has the metric (running / waiting requests, KV usage,
TTFT, inter-token and end-to-end latency, preemptions, token and request counts),
so existing dashboards work; fsd's own carry the `fsd_` prefix (per-level queues,
swaps and their bytes, promotions, demotions, the next swap-in's ENST, the reserve).

Feeding is cheap and thread-safe: the telemetry publisher hands over every snapshot
and event it sends, the engine hands over every finished job, and each is only put
on a queue. The HTTP thread drains the queue (`pump`) and updates the metrics, so
the engine thread never pays for a histogram. Gauges come from the latest snapshot,
which exists only while telemetry is on (`telemetry_hz > 0`).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fsd import protocol as P
from fsd.engine.output import RequestOutput

CONTENT_TYPE = CONTENT_TYPE_LATEST  # the format generate_latest writes

# vLLM's bucket boundaries, so histograms from both can be compared and aggregated
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

# telemetry event kind → (counter attribute, label value or None)
_EVENT_COUNTERS = {
    "preempt": ("preemptions", None),
    "promote": ("promotions", None),
    "demote": ("demotions", None),
    "recompute": ("recomputes", None),
    "swap-out-begin": ("swaps", "out"),
    "swap-in-begin": ("swaps", "in"),
}


class MetricsCollector:
    """All metrics of one daemon in a private registry; `render()` is the /metrics body."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        reg, m = self.registry, ["model_name"]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token (arrival to first output).",
            m,
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens of a job.",
            m,
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Arrival to the last output token.",
            m,
            buckets=E2E_BUCKETS,
            registry=reg,
        )
        self.success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason (stop, length, abort).",
            [*m, "finished_reason"],
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of finished requests.", m, registry=reg
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Output tokens of finished requests.", m, registry=reg
        )
        self.preemptions = Counter(
            "vllm:num_preemptions",
            "Jobs left out of an iteration's batch (fsd preempts after any token).",
            m,
            registry=reg,
        )
        self.promotions = Counter(
            "fsd_promotions", "Starvation promotions to a higher MLFQ level.", registry=reg
        )
        self.demotions = Counter(
            "fsd_demotions", "Demotions to a lower MLFQ level (quantum used up).", registry=reg
        )
        self.recomputes = Counter(
            "fsd_recomputes", "KV caches dropped to be recomputed later.", registry=reg
        )
        self.swaps = Counter(
            "fsd_swaps",
            "KV swaps started, by direction (out to host, in to device).",
            ["direction"],
            registry=reg,
        )
        self.gauges = SnapshotGauges(model_name)
        reg.register(self.gauges)
        # every series exists from the start at 0, so rate() and increase() see the first job
        for metric in (
            self.ttft,
            self.itl,
            self.e2e,
            self.prompt_tokens,
            self.generation_tokens,
            self.preemptions,
        ):
            metric.labels(model_name)
        for reason in ("stop", "length", "abort"):
            self.success.labels(model_name, reason)
        for direction in ("out", "in"):
            self.swaps.labels(direction)

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
        target = _EVENT_COUNTERS.get(e.kind)
        if target is None:
            return
        name, label = target
        counter: Counter = getattr(self, name)
        if name == "preemptions":
            counter.labels(self.model_name).inc()
        elif label is not None:
            counter.labels(label).inc()
        else:
            counter.inc()

    def _finished(self, out: RequestOutput) -> None:
        name = self.model_name
        self.success.labels(name, out.finish_reason or "abort").inc()
        self.prompt_tokens.labels(name).inc(len(out.prompt_token_ids))
        self.generation_tokens.labels(name).inc(len(out.token_ids))
        if out.ttft is not None:
            self.ttft.labels(name).observe(max(0.0, out.ttft))
        if out.latency is not None and out.token_ids:
            self.e2e.labels(name).observe(max(0.0, out.latency))
        itl = self.itl.labels(name)
        times = out.token_times
        for prev, cur in zip(times, times[1:], strict=False):
            itl.observe(max(0.0, cur - prev))


class SnapshotGauges(Collector):
    """Gauges read from the latest telemetry snapshot at scrape time."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.snapshot: P.Snapshot | None = None
        self.running = 0  # from the last job table (snapshots may come without one)
        self.swapped = 0
        self.next_swap_in: float | None = None

    def update(self, snap: P.Snapshot) -> None:
        self.snapshot = snap
        if snap.jobs is not None:
            self.running = sum(1 for j in snap.jobs if j.state == "running")
            on_host = [j for j in snap.jobs if j.kv == "host"]
            self.swapped = len(on_host)
            enst = [j.enst for j in on_host if j.enst is not None]
            self.next_swap_in = min(enst) if enst else None

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        if snap is None:
            return
        m = [self.model_name]
        live = sum(len(lv.job_ids) for lv in snap.levels)
        running = min(self.running, live)
        yield _gauge("vllm:num_requests_running", "Jobs in the last iteration's batch.", m, running)
        yield _gauge("vllm:num_requests_waiting", "Live jobs not running.", m, live - running)
        yield _gauge(
            "vllm:num_requests_swapped",
            "Jobs whose KV is in host memory.",
            m,
            min(self.swapped, live),
        )
        kv = snap.kv
        yield _gauge(
            "vllm:kv_cache_usage_perc",
            "Share of device KV blocks in use (1 = full).",
            m,
            kv.device_used / kv.device_total if kv.device_total else 0.0,
        )
        yield from self._levels(snap)
        yield from self._kv(kv)
        if self.next_swap_in is not None:
            yield _gauge(
                "fsd_next_swap_in_enst_seconds",
                "Smallest ENST among jobs on the host: when the next swap-in is due.",
                None,
                self.next_swap_in,
            )
        yield from self._slo(snap.slo)
        info = GaugeMetricFamily(
            "fsd_info", "The daemon's policies.", labels=["model_name", "policy", "kv_policy"]
        )
        kv_policy = str(snap.config.get("cache", {}).get("kv_policy", ""))
        info.add_metric([self.model_name, snap.policy, kv_policy], 1.0)
        yield info
        yield _gauge(
            "fsd_snapshot_timestamp_seconds", "When the latest snapshot was taken.", None, snap.time
        )

    def _levels(self, snap: P.Snapshot) -> Iterator[Metric]:
        length = GaugeMetricFamily("fsd_queue_length", "Jobs in each MLFQ level.", labels=["level"])
        quantum = GaugeMetricFamily(
            "fsd_queue_quantum_seconds", "Each level's quantum.", labels=["level"]
        )
        for lv in snap.levels:
            level = str(lv.index)  # 1-based on the wire: Q1..Qn, as the paper and fsctl name them
            length.add_metric([level], len(lv.job_ids))
            if lv.quantum is not None:
                quantum.add_metric([level], lv.quantum)
        yield length
        yield quantum

    def _kv(self, kv: P.KVInfo) -> Iterator[Metric]:
        device = GaugeMetricFamily(
            "fsd_kv_device_blocks", "Device KV blocks by state.", labels=["state"]
        )
        for state, value in (
            ("total", kv.device_total),
            ("used", kv.device_used),
            ("free", kv.device_free),
        ):
            device.add_metric([state], value)
        yield device
        host = GaugeMetricFamily("fsd_kv_host_blocks", "Host KV blocks by state.", labels=["state"])
        host.add_metric(["total"], kv.host_total)
        host.add_metric(["used"], kv.host_used)
        yield host
        yield _gauge(
            "fsd_kv_reserve_blocks",
            "Free device blocks the proactive swapper keeps for arrivals.",
            None,
            kv.device_reserved,
        )
        yield _gauge(
            "fsd_kv_bytes_in_flight", "KV bytes being copied now.", None, kv.bytes_in_flight
        )
        swapped = CounterMetricFamily(
            "fsd_swap_bytes", "KV bytes swapped, by direction.", labels=["direction"]
        )
        swapped.add_metric(["out"], kv.swapped_out_bytes)
        swapped.add_metric(["in"], kv.swapped_in_bytes)
        yield swapped

    def _slo(self, slo: P.SLOInfo) -> Iterator[Metric]:
        ptl = GaugeMetricFamily(
            "fsd_per_token_latency_seconds",
            "Per-token latency (latency / output tokens) over the SLO window.",
            labels=["stat"],
        )
        for stat, value in (("avg", slo.avg_per_token_latency), ("p95", slo.p95_per_token_latency)):
            if value is not None:
                ptl.add_metric([stat], value)
        yield ptl
        yield _gauge(
            "fsd_slo_per_token_latency_seconds",
            "The per-token latency SLO.",
            None,
            slo.slo_per_token_latency,
        )


def _gauge(name: str, doc: str, model: list[str] | None, value: float) -> GaugeMetricFamily:
    if model is None:
        return GaugeMetricFamily(name, doc, value=value)
    g = GaugeMetricFamily(name, doc, labels=["model_name"])
    g.add_metric(model, value)
    return g
