"""Prometheus gauges read at scrape time from the latest telemetry snapshot."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fsd import protocol as P


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
        if snap.prefix is not None:  # None from a daemon that predates the prefix cache
            yield from self._prefix(snap.prefix)
        yield from self._slo(snap.slo)
        if snap.replicas:
            yield from self._replicas(snap.replicas)
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

    def _prefix(self, p: P.PrefixInfo) -> Iterator[Metric]:
        """The prefix cache: vLLM's token counters, then fsd's per-tier blocks and evictions."""
        name, m = self.model_name, [self.model_name]
        queries = "Prompt tokens looked up in the prefix cache."
        host_hits = "Prefix cache hits copied back from the host tier (tokens)."
        for metric, doc, value in (
            ("vllm:prefix_cache_queries", queries, p.queries),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", p.hits),
            ("fsd_prefix_cache_host_hits", host_hits, p.host_hits),
        ):
            counter = CounterMetricFamily(metric, doc, labels=["model_name"])
            counter.add_metric(m, value)
            yield counter
        yield _gauge(
            "fsd_prefix_cache_enabled",
            "1 while the prefix cache is on (retunable).",
            m,
            float(p.enabled),
        )
        tier = ["model_name", "tier"]
        blocks = GaugeMetricFamily(
            "fsd_prefix_cache_blocks", "KV blocks holding cached prefixes, by tier.", labels=tier
        )
        evictions = CounterMetricFamily(
            "fsd_prefix_cache_evictions",
            "Cached prefix blocks taken for new content, by tier (device ones move to the host).",
            labels=tier,
        )
        for t, cached, evicted in (
            ("device", p.device_blocks, p.device_evictions),
            ("host", p.host_blocks, p.host_evictions),
        ):
            blocks.add_metric([name, t], cached)
            evictions.add_metric([name, t], evicted)
        yield blocks
        yield evictions

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


    def _replicas(self, replicas: list[P.ReplicaInfo]) -> Iterator[Metric]:
        """A daemon of several replicas: each one's jobs, KV blocks and health."""
        labels = ["model_name", "replica", "state"]
        jobs = GaugeMetricFamily("fsd_replica_requests", "Jobs per replica, by state.", labels=labels)
        kv = GaugeMetricFamily(
            "fsd_replica_kv_device_blocks", "Device KV blocks per replica, by state.", labels=labels
        )
        up = GaugeMetricFamily(
            "fsd_replica_up", "1 while the replica is healthy.", labels=["model_name", "replica"]
        )
        for r in replicas:
            at = [self.model_name, str(r.index)]
            jobs.add_metric([*at, "live"], r.live)
            jobs.add_metric([*at, "running"], r.running)
            if r.kv is not None:
                kv.add_metric([*at, "used"], r.kv.device_used)
                kv.add_metric([*at, "total"], r.kv.device_total)
            up.add_metric(at, float(r.health == "ok"))
        yield jobs
        yield kv
        yield up


def _gauge(name: str, doc: str, model: list[str], value: float) -> GaugeMetricFamily:
    """A gauge with one sample labelled by `model` (the served model name)."""
    g = GaugeMetricFamily(name, doc, labels=["model_name"])
    g.add_metric(model, value)
    return g
