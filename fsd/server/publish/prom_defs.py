"""Prometheus metric definitions: vLLM's buckets and the per-request histograms and counters."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

# vLLM's bucket boundaries, so histograms from both can be compared and aggregated
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

# vLLM's time per output token buckets are its inter-token ones
TPOT_BUCKETS = ITL_BUCKETS
QUEUE_BUCKETS = E2E_BUCKETS  # vLLM's request_latency_buckets, as for e2e latency

# telemetry event kind → (counter attribute of RequestMetrics, label value or None)
EVENT_COUNTERS = {
    "preempt": ("preemptions", None),
    "promote": ("promotions", None),
    "demote": ("demotions", None),
    "recompute": ("recomputes", None),
    "swap-out-begin": ("swaps", "out"),
    "swap-in-begin": ("swaps", "in"),
    "refuse": ("refused", None),
}


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


class RequestMetrics:
    """The histograms and counters fed by results and events, each series there from 0."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int) -> None:
        """`max_model_len` bounds the token-count buckets."""
        self._reg = registry
        self._histograms(build_1_2_5_buckets(max_model_len))
        self._counters()
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
            self.refused,
        ):
            metric.labels(model_name)
        for reason in ("stop", "length", "abort", "error"):
            self.success.labels(model_name, reason)
        for direction in ("out", "in"):
            self.swaps.labels(model_name, direction)

    def _histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, doc, ["model_name"], buckets=buckets, registry=self._reg)

    def _counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(name, doc, ["model_name", *labels], registry=self._reg)

    def _histograms(self, token_buckets: Sequence[float]) -> None:
        h = self._histogram
        self.ttft = h(
            "vllm:time_to_first_token_seconds",
            "Time to first token (arrival to first output).",
            TTFT_BUCKETS,
        )
        self.itl = h(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens of a job.",
            ITL_BUCKETS,
        )
        self.tpot = h(
            "vllm:time_per_output_token_seconds",
            "Time per output token: each gap between consecutive output tokens of a job.",
            TPOT_BUCKETS,
        )
        self.e2e = h(
            "vllm:e2e_request_latency_seconds", "Arrival to the last output token.", E2E_BUCKETS
        )
        self.queue_time = h(
            "vllm:request_queue_time_seconds",
            "Arrival to first scheduled (the start event; needs telemetry on).",
            QUEUE_BUCKETS,
        )
        self.request_prompt_tokens = h(
            "vllm:request_prompt_tokens", "Prompt tokens of each finished request.", token_buckets
        )
        self.request_generation_tokens = h(
            "vllm:request_generation_tokens",
            "Output tokens of each finished request.",
            token_buckets,
        )

    def _counters(self) -> None:
        c = self._counter
        self.success = c(
            "vllm:request_success",
            "Finished requests by finish reason (stop, length, abort).",
            "finished_reason",
        )
        self.prompt_tokens = c("vllm:prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = c("vllm:generation_tokens", "Output tokens of finished requests.")
        self.preemptions = c(
            "vllm:num_preemptions",
            "Jobs left out of an iteration's batch (fsd preempts after any token).",
        )
        self.promotions = c("fsd_promotions", "Starvation promotions to a higher MLFQ level.")
        self.demotions = c("fsd_demotions", "Demotions to a lower MLFQ level (quantum used up).")
        self.recomputes = c("fsd_recomputes", "KV caches dropped to be recomputed later.")
        self.refused = c(
            "fsd_requests_refused_overloaded",
            "Requests refused as predicted to miss the SLO (refuse_late; off by default).",
        )
        self.swaps = c(
            "fsd_swaps", "KV swaps started, by direction (out to host, in to device).", "direction"
        )
