"""Prometheus metrics of the daemon, served at /metrics by the HTTP frontend.

Names follow vLLM where vLLM has the metric (running / waiting requests, KV usage
under its current and its older name, TTFT, time per output token, inter-token,
queue and end-to-end latency, per-request prompt and generation tokens, preemptions,
token and request counts), with vLLM's buckets, so existing dashboards work; fsd's
own carry the `fsd_` prefix (per-level queues, swaps and their bytes, promotions,
demotions, the next swap-in's ENST, the reserve). Every metric carries the
`model_name` label, as vLLM's do.

Time per output token is observed per token gap, as vLLM v1 does (the same samples
as the inter-token latency, which later vLLM versions renamed it to). Queue time is
arrival to first scheduled: the job's arrival (its result) to its `start` telemetry
event (the iteration that first scheduled it), so it needs telemetry on.

Feeding is cheap and thread-safe: the telemetry publisher hands over every snapshot
and event it sends, the engine hands over every finished job, and each is only put
on a queue. The HTTP thread drains the queue (`pump`) and updates the metrics, so
the engine thread never pays for a histogram. Gauges come from the latest snapshot,
which exists only while telemetry is on (`telemetry_hz > 0`).
"""

from __future__ import annotations

import queue
from collections import OrderedDict
from collections.abc import Iterator, Sequence
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

# vLLM's time per output token buckets are its inter-token ones
TPOT_BUCKETS = ITL_BUCKETS
QUEUE_BUCKETS = E2E_BUCKETS  # vLLM's request_latency_buckets, as for e2e latency
_PENDING_CAP = 65_536  # jobs waiting for their start event or result (one may be lost)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value`: vLLM's token-count buckets."""
    buckets: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(buckets)
            buckets.append(m * scale)
        scale *= 10


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
        reg, m = self.registry, ["model_name"]

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, m, buckets=buckets, registry=reg)

        token_buckets = build_1_2_5_buckets(max_model_len)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token (arrival to first output).",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens of a job.",
            ITL_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Time per output token: each gap between consecutive output tokens of a job.",
            TPOT_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Arrival to the last output token.",
            E2E_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Arrival to first scheduled (the start event; needs telemetry on).",
            QUEUE_BUCKETS,
        )
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens",
            "Prompt tokens of each finished request.",
            token_buckets,
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Output tokens of each finished request.",
            token_buckets,
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
            "fsd_promotions", "Starvation promotions to a higher MLFQ level.", m, registry=reg
        )
        self.demotions = Counter(
            "fsd_demotions", "Demotions to a lower MLFQ level (quantum used up).", m, registry=reg
        )
        self.recomputes = Counter(
            "fsd_recomputes", "KV caches dropped to be recomputed later.", m, registry=reg
        )
        self.swaps = Counter(
            "fsd_swaps",
            "KV swaps started, by direction (out to host, in to device).",
            [*m, "direction"],
            registry=reg,
        )
        self.gauges = SnapshotGauges(model_name)
        reg.register(self.gauges)
        # every series exists from the start at 0, so rate() and increase() see the first job
        for metric in (
            self.ttft,
            self.itl,
            self.tpot,
            self.e2e,
            self.queue_time,
            self.request_prompt_tokens,
            self.request_generation_tokens,
            self.prompt_tokens,
            self.generation_tokens,
            self.preemptions,
            self.promotions,
            self.demotions,
            self.recomputes,
        ):
            metric.labels(model_name)
        for reason in ("stop", "length", "abort", "error"):
            self.success.labels(model_name, reason)
        for direction in ("out", "in"):
            self.swaps.labels(model_name, direction)

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
        target = _EVENT_COUNTERS.get(e.kind)
        if target is None:
            return
        name, label = target
        counter: Counter = getattr(self, name)
        if label is not None:
            counter.labels(self.model_name, label).inc()
        else:
            counter.labels(self.model_name).inc()

    def _job_started(self, job_id: str, when: float) -> None:
        arrival = self._arrived.pop(job_id, None)
        if arrival is not None:
            self.queue_time.labels(self.model_name).observe(max(0.0, when - arrival))
        else:
            _put_bounded(self._started, job_id, when)

    def _finished(self, out: RequestOutput) -> None:
        name = self.model_name
        self.success.labels(name, out.finish_reason or "abort").inc()
        self.prompt_tokens.labels(name).inc(len(out.prompt_token_ids))
        self.generation_tokens.labels(name).inc(len(out.token_ids))
        self.request_prompt_tokens.labels(name).observe(len(out.prompt_token_ids))
        self.request_generation_tokens.labels(name).observe(len(out.token_ids))
        if out.ttft is not None:
            self.ttft.labels(name).observe(max(0.0, out.ttft))
        if out.latency is not None and out.token_ids:
            self.e2e.labels(name).observe(max(0.0, out.latency))
        if self._events:
            start = self._started.pop(out.request_id, None)
            if start is not None:
                self.queue_time.labels(name).observe(max(0.0, start - out.arrival_time))
            elif out.first_token_time is not None:  # it ran, so its start event is on its way
                _put_bounded(self._arrived, out.request_id, out.arrival_time)
        itl, tpot = self.itl.labels(name), self.tpot.labels(name)
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
        usage = kv.device_used / kv.device_total if kv.device_total else 0.0
        yield _gauge(
            "vllm:kv_cache_usage_perc", "Share of device KV blocks in use (1 = full).", m, usage
        )
        yield _gauge(
            "vllm:gpu_cache_usage_perc",
            "Share of device KV blocks in use (1 = full); vLLM's older name of kv_cache_usage_perc.",
            m,
            usage,
        )
        yield from self._levels(snap)
        yield from self._kv(kv)
        if self.next_swap_in is not None:
            yield _gauge(
                "fsd_next_swap_in_enst_seconds",
                "Smallest ENST among jobs on the host: when the next swap-in is due.",
                m,
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
            "fsd_snapshot_timestamp_seconds", "When the latest snapshot was taken.", m, snap.time
        )

    def _levels(self, snap: P.Snapshot) -> Iterator[Metric]:
        labels = ["model_name", "level"]
        length = GaugeMetricFamily("fsd_queue_length", "Jobs in each MLFQ level.", labels=labels)
        quantum = GaugeMetricFamily(
            "fsd_queue_quantum_seconds", "Each level's quantum.", labels=labels
        )
        for lv in snap.levels:
            level = str(lv.index)  # 1-based on the wire: Q1..Qn, as the paper and fsctl name them
            length.add_metric([self.model_name, level], len(lv.job_ids))
            if lv.quantum is not None:
                quantum.add_metric([self.model_name, level], lv.quantum)
        yield length
        yield quantum

    def _kv(self, kv: P.KVInfo) -> Iterator[Metric]:
        name, m = self.model_name, [self.model_name]
        device = GaugeMetricFamily(
            "fsd_kv_device_blocks", "Device KV blocks by state.", labels=["model_name", "state"]
        )
        for state, value in (
            ("total", kv.device_total),
            ("used", kv.device_used),
            ("free", kv.device_free),
        ):
            device.add_metric([name, state], value)
        yield device
        host = GaugeMetricFamily(
            "fsd_kv_host_blocks", "Host KV blocks by state.", labels=["model_name", "state"]
        )
        host.add_metric([name, "total"], kv.host_total)
        host.add_metric([name, "used"], kv.host_used)
        yield host
        yield _gauge(
            "fsd_kv_reserve_blocks",
            "Free device blocks the proactive swapper keeps for arrivals.",
            m,
            kv.device_reserved,
        )
        yield _gauge("fsd_kv_bytes_in_flight", "KV bytes being copied now.", m, kv.bytes_in_flight)
        swapped = CounterMetricFamily(
            "fsd_swap_bytes", "KV bytes swapped, by direction.", labels=["model_name", "direction"]
        )
        swapped.add_metric([name, "out"], kv.swapped_out_bytes)
        swapped.add_metric([name, "in"], kv.swapped_in_bytes)
        yield swapped

    def _slo(self, slo: P.SLOInfo) -> Iterator[Metric]:
        m = [self.model_name]
        ptl = GaugeMetricFamily(
            "fsd_per_token_latency_seconds",
            "Per-token latency (latency / output tokens) over the SLO window.",
            labels=["model_name", "stat"],
        )
        for stat, value in (("avg", slo.avg_per_token_latency), ("p95", slo.p95_per_token_latency)):
            if value is not None:
                ptl.add_metric([*m, stat], value)
        yield ptl
        yield _gauge(
            "fsd_slo_per_token_latency_seconds",
            "The per-token latency SLO.",
            m,
            slo.slo_per_token_latency,
        )


def _gauge(name: str, doc: str, model: list[str], value: float) -> GaugeMetricFamily:
    """A gauge with one sample labelled by `model` (the served model name)."""
    g = GaugeMetricFamily(name, doc, labels=["model_name"])
    g.add_metric(model, value)
    return g
