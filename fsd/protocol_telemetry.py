"""Telemetry's messages (snapshots and events) and the job rows replies carry too.

Split from `fsd.protocol`, which re-exports every name here: code reads them as
`fsd.protocol.Snapshot` and so on. Fields added within a protocol version are
optional (a None or empty default): a frame from an older daemon decodes with them
absent, and an older client skips the ones it does not know.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fsd.wire import PROTOCOL_VERSION


class JobInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One live job as the scheduler sees it; `level` is 1-based (1 = Q1, the top).

    `prefilled` is the prefill's progress: the prompt tokens whose KV is cached, from 0
    to `prompt_tokens` (short of it between the chunks of a chunked prefill, back to 0
    when the job's KV was dropped). None from a daemon that predates it.
    `rank` is the job's place in the scheduler's order, 1-based as levels are (1 runs
    first; running jobs rank where the preemption threshold lifts them). None from a
    daemon that predates it.
    `cached_tokens`: prompt tokens its first prefill found in the prefix cache (0 from a
    daemon that predates it).
    """

    job_id: str
    state: str
    level: int
    kv: str
    blocks: int
    host_blocks: int
    enst: float | None
    prompt_tokens: int
    prefilled: int | None = None
    output_tokens: int
    waited: float
    attained: float
    arrival: float
    preemptions: int = 0
    swaps_out: int = 0
    swaps_in: int = 0
    recomputes: int = 0
    promotions: int = 0
    demotions: int = 0
    tags: list[str] = []
    rank: int | None = None
    cached_tokens: int = 0


class LevelInfo(msgspec.Struct, kw_only=True):
    """One queue level; `index` is 1-based (1 = Q1)."""

    index: int
    quantum: float | None
    job_ids: list[str]


class KVInfo(msgspec.Struct, kw_only=True):
    block_size: int
    device_total: int
    device_used: int
    device_reserved: int
    device_free: int
    host_total: int
    host_used: int
    bytes_in_flight: int
    swapped_out_bytes: int
    swapped_in_bytes: int


class PrefixInfo(msgspec.Struct, kw_only=True):
    """The prefix cache's counters (`fsd.kv.prefix.PrefixCache.stats`), cumulative since start.

    `queries`: prompt tokens looked up at admission; `hits`: of them, reused (both as
    vLLM counts them); `host_hits`: of the hits, copied back from the host tier. A
    lookup undone (its job did not run after all) leaves these counts, so they may
    fall; `lookups` and `lookup_hits` count every lookup and only grow (a rate over
    an interval reads them).
    `*_blocks`: blocks holding cached content per tier; `*_evictions`: cached blocks
    taken for new content (a device block evicted moves to the host when it has room).
    """

    enabled: bool
    queries: int
    hits: int
    host_hits: int
    device_blocks: int
    host_blocks: int
    device_evictions: int
    host_evictions: int
    lookups: int = 0
    lookup_hits: int = 0

    @property
    def hit_rate(self) -> float:
        """Hits / queries (0 before any query)."""
        return self.hits / self.queries if self.queries else 0.0

    @property
    def host_hit_rate(self) -> float:
        """The share of queried tokens reused from the host tier."""
        return self.host_hits / self.queries if self.queries else 0.0


class IterationInfo(msgspec.Struct, kw_only=True):
    start: float
    duration: float
    batch_size: int
    prefill_tokens: int
    decode_tokens: int


class SLOInfo(msgspec.Struct, kw_only=True):
    """Statistics over the jobs finished in the last `window` seconds."""

    window: float
    finished: int
    avg_per_token_latency: float | None
    p95_per_token_latency: float | None
    avg_ttft: float | None
    p95_ttft: float | None
    tokens_per_s: float
    requests_per_s: float
    slo_per_token_latency: float
    preemptions_per_request: float | None = None  # None: nothing finished, or an older daemon
    swaps_per_request: float | None = None


class LearnedInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The output-length distribution a policy learned from finished jobs.

    `ready`: enough jobs finished for the policy to act on it (fsd.sched.lengths).
    `quantiles`: (q, output tokens), q in (0, 1). `by_prompt`: per prompt-length class,
    (prompt tokens up to, samples, median output tokens); empty when the policy does
    not condition on the prompt.
    """

    samples: int
    ready: bool
    mean: float | None = None
    quantiles: list[tuple[float, int]] = []
    by_prompt: list[tuple[int, int, int]] = []


class SchedInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the scheduler learned while serving.

    `live_cost`: measured / predicted iteration time, the factor service is charged
    by (1.0: the start-up profile as is, before `live_cost_samples` iterations were
    measured). `learned`: None when the policy learns no output lengths.
    """

    live_cost: float = 1.0
    live_cost_samples: int = 0
    learned: LearnedInfo | None = None


class ReplicaInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One replica of a daemon that runs several (fsd.cluster): its load and health.

    `levels`: its queued jobs per level (Q1 first); `health`: "ok", or why not; its
    pools and prefix cache as the daemon's own are shown.
    """

    index: int
    health: str = "ok"
    live: int = 0
    running: int = 0
    iterations: int = 0
    levels: list[int] = []
    kv: KVInfo | None = None
    prefix: PrefixInfo | None = None


class RouteInfo(msgspec.Struct, kw_only=True):
    """One of the router's recent decisions: which replica took a job, and why."""

    time: float
    job_id: str
    replica: int
    why: str


class Snapshot(msgspec.Struct, kw_only=True):
    """The engine's observable state. The job table costs a few microseconds per job to
    read, so with many jobs the daemon sends it in only some snapshots (see
    `ServerConfig.telemetry_job_budget`): `jobs` is None when this snapshot carries no
    table, and `jobs_time` is when the latest table was read. Everything else is
    in every snapshot."""

    v: int = PROTOCOL_VERSION
    time: float
    seq: int
    policy: str
    levels: list[LevelInfo]
    jobs: list[JobInfo] | None
    jobs_time: float | None = None
    kv: KVInfo
    iterations: list[IterationInfo]
    slo: SLOInfo
    config: dict[str, Any]
    sched: SchedInfo | None = None  # None from a daemon that predates it
    prefix: PrefixInfo | None = None  # the prefix cache; None from a daemon that predates it
    # a daemon of several replicas: each one, and the router's recent decisions (None:
    # one replica, or a daemon that predates them)
    replicas: list[ReplicaInfo] | None = None
    routes: list[RouteInfo] | None = None


class Event(msgspec.Struct, kw_only=True, omit_defaults=True):
    """arrive, start, preempt, demote, promote, swap-out-begin/end, swap-in-begin/end,
    recompute, finish, abort, retune."""

    v: int = PROTOCOL_VERSION
    time: float
    kind: str
    job_id: str | None = None
    detail: dict[str, Any] = {}
