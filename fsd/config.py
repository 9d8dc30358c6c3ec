"""Frozen configuration slices, one per component.

Each component takes only its own slice. `EngineConfig.from_kwargs` builds all of
them from keyword arguments named after the fields, so `fsd.LLM(num_gpu_blocks=64)`
and a TOML file or CLI flag use the same names. The bounds and checks the slices
share are in `fsd.config_checks`; `fsd.config_file.build_configs` reads fsd.toml and
CLI overrides into them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from fsd.config_checks import (
    MAX_BATCH_SIZE,
    MAX_BATCH_TOKENS,
    MAX_LEVELS,
    MAX_QUANTUM_RATIO,
    MAX_REPLICAS,
    MAX_RESERVE_JOBS,
    MAX_SECONDS,
    at_most,
    check_http,
    check_prefill_chunk,
    check_quanta,
    check_types,
    choice,
    doc,
    finite,
    int_range,
    real_range,
    setting_pairs,
)
from fsd.errors import ConfigError

DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
ATTN_BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to run and how its weights are held."""

    model: str = doc("tiny", "Preset name or local HuggingFace directory.")
    dtype: str = doc("auto", f"{', '.join(DTYPES)}.")
    device: str = doc("auto", f"{', '.join(DEVICES)}.")
    seed: int = 0
    max_model_len: int | None = None
    attn_backend: str = "auto"
    cuda_graphs: bool = doc(True, "Replay decode steps as CUDA graphs (CUDA, Triton backend).")
    # fsd.engine.ahead; None: on a GPU (tp = pp = 1)
    schedule_ahead: bool | None = doc(None, "Schedule the next step while the device runs this one.")
    # None: OMP_NUM_THREADS, else fsd.engine.threads decides
    threads: int | None = doc(
        None, "Torch threads of a CPU worker (default: usable CPUs less one; the log says why)."
    )

    def __post_init__(self) -> None:
        check_types(self)
        choice("dtype", self.dtype, DTYPES)
        choice("device", self.device, DEVICES)
        choice("attn_backend", self.attn_backend, ATTN_BACKENDS)
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.threads is not None:
            int_range("threads", self.threads, 1, 1024)


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: block size and how many blocks each tier holds."""

    block_size: int = doc(16, "Tokens per KV block.")
    num_gpu_blocks: int | None = doc(
        None, "KV blocks on the device (default: from its memory; simulated: the profile's)."
    )
    gpu_memory_utilization: float = 0.85
    cpu_device_kv_bytes: int = 256 * 1024 * 1024  # the device tier's KV on a CPU device
    num_host_blocks: int | None = doc(
        None, "KV blocks in host memory (default: host_kv_bytes; simulated: 4 x device)."
    )
    host_kv_bytes: int = 1024 * 1024 * 1024
    kv_policy: str = doc("proactive", "The KV policy (fsd.kv.registry).")
    # K = 4, K' = 2 measured better than 1, 1 on every simulated workload (bench/policies.py)
    reserve_min_jobs: int = doc(4, "K: reserve room for at least K new jobs.")
    reserve_top_levels: int = doc(2, "K': or for the jobs in the top K' levels.")
    # a job without KV starts only while device + host use, with its blocks, stays within
    # this share of both pools (admission control: a started job always has room to go)
    admit_fraction: float = doc(
        0.9, "New jobs start while device+host KV use stays under this."
    )
    # fsd.kv.prefix; retunable live
    prefix_cache: bool = doc(
        True, "Reuse the KV of cached prompt prefixes (a trace's prefix hashes: Mooncake)."
    )

    def __post_init__(self) -> None:
        check_types(self)  # kv_policy names one of fsd.kv.registry's: checked where it is built
        if self.host_kv_bytes < 0:
            raise ConfigError(f"host_kv_bytes must be >= 0, got {self.host_kv_bytes}")
        # retunable live: each is bounded, so a retune cannot store a value that breaks
        # the planner's arithmetic or the config's msgpack encoding in telemetry
        int_range("reserve_min_jobs (K)", self.reserve_min_jobs, 0, MAX_RESERVE_JOBS)
        int_range("reserve_top_levels (K')", self.reserve_top_levels, 0, MAX_LEVELS)
        if not 0.0 < self.admit_fraction <= 1.0:
            raise ConfigError(f"admit_fraction must be in (0, 1], got {self.admit_fraction}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two >= 1, got {self.block_size}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ConfigError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.cpu_device_kv_bytes < 1:
            raise ConfigError(f"cpu_device_kv_bytes must be >= 1, got {self.cpu_device_kv_bytes}")
        if self.num_host_blocks is not None and self.num_host_blocks < 0:
            raise ConfigError(f"num_host_blocks must be >= 0, got {self.num_host_blocks}")


MAX_REFUSE_SLOS = 1e6  # refuse_late's bound: a million SLOs is never


@dataclass(frozen=True)
class SchedConfig:
    """Scheduling policy and batch limits."""

    policy: str = doc("default", "The scheduling policy (fsd.sched.registry).")
    max_batch_size: int = doc(32, "Most jobs in one iteration.")
    max_batch_tokens: int = doc(4096, "Most new tokens in one iteration.")
    num_levels: int = doc(8, "MLFQ levels.")
    # None = the profile's minimum iteration time
    q1: float | None = doc(None, "Top-level quantum, s (default: a decode step).")
    quantum_ratio: float = doc(2.0, "q(k+1) / q(k).")
    quanta: tuple[float, ...] | None = None  # explicit per-level quanta (strictly increasing)
    # refuse (error "overloaded") a request whose predicted per-token latency on arrival
    # exceeds this many SLOs (Scheduler.predicted_latency); None: never refuse (default)
    refuse_late: float | None = None
    refuse_wait: float | None = doc(
        None, "Refuse (error overloaded, with a retry hint) a request predicted to wait more "
        "than this many seconds for its first token (unset: never, the default)."
    )
    # chunked prefill: an iteration carries at most this many prompt tokens beside its
    # decodes; a longer prompt runs as chunks, each a preemption point (0: whole
    # prefills; None: the most whose prefill fits the per-token SLO, fsd.sched.chunking)
    prefill_chunk: int | None = doc(
        None, "Chunked prefill: most prompt tokens an iteration carries beside its decodes "
        "(0 = whole prefills; else at least --block-size; unset: the most whose prefill "
        "fits the SLO)."
    )
    profile: str | None = doc(None, "Cost-model JSON (fsd profile) or shipped profile name.")
    # each policy's own settings as (POLICY.FIELD, value): declared on its queue class and
    # checked where the policy is built (fsd.sched.settings); a mapping is taken too
    policy_settings: tuple[tuple[str, Any], ...] = doc(
        (), "A policy's own setting, POLICY.FIELD=VALUE (repeat for more)."
    )

    def __post_init__(self) -> None:
        """Types, then ranges: every value a retune may set has a lower and an upper bound."""
        object.__setattr__(self, "policy_settings", setting_pairs(self.policy_settings))
        check_types(self)
        for name in ("q1", "quantum_ratio", "refuse_late", "refuse_wait"):
            finite(name, getattr(self, name))
        if self.quanta is not None:
            object.__setattr__(self, "quanta", check_quanta(self.quanta))
        if not 1 <= self.num_levels <= MAX_LEVELS:
            raise ConfigError(f"num_levels must be in 1..{MAX_LEVELS}, got {self.num_levels}")
        if self.q1 is not None and self.q1 <= 0:
            raise ConfigError(f"q1 must be > 0 seconds, got {self.q1}")
        at_most("q1", self.q1, MAX_SECONDS, " seconds (one day)")
        if self.quantum_ratio <= 1.0:
            raise ConfigError(f"quantum_ratio must be > 1, got {self.quantum_ratio}")
        try:  # the last level's quantum, q1 x ratio^(levels - 1), must be a number
            last = (self.q1 or 1.0) * self.quantum_ratio ** (self.num_levels - 1)
        except OverflowError:
            last = math.inf
        if not math.isfinite(last):
            raise ConfigError(
                f"quantum_ratio {self.quantum_ratio} over {self.num_levels} levels overflows "
                "the last quantum: use fewer levels or a smaller ratio"
            )
        at_most("quantum_ratio", self.quantum_ratio, MAX_QUANTUM_RATIO)
        if self.refuse_late is not None and not 0 < self.refuse_late <= MAX_REFUSE_SLOS:
            raise ConfigError(
                f"refuse_late must be in (0, {MAX_REFUSE_SLOS}] SLOs, got {self.refuse_late}"
            )
        if self.refuse_wait is not None and self.refuse_wait <= 0:
            raise ConfigError(f"refuse_wait must be > 0 seconds, got {self.refuse_wait}")
        at_most("refuse_wait", self.refuse_wait, MAX_SECONDS, " seconds (one day)")
        int_range("max_batch_size", self.max_batch_size, 1, MAX_BATCH_SIZE)
        int_range("max_batch_tokens", self.max_batch_tokens, 1, MAX_BATCH_TOKENS)
        if self.prefill_chunk is not None:
            int_range("prefill_chunk", self.prefill_chunk, 0, MAX_BATCH_TOKENS, " tokens (0: off)")


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor and pipeline parallel degrees and the Ray cluster that runs them.

    tp = pp = 1 without ray_address runs in process; anything else runs tp x pp Ray
    actors (one per GPU, or CPU actors), on the cluster at ray_address or a local one.
    """

    tp: int = doc(1, "Tensor-parallel degree: shard heads and MLP over N Ray workers.")
    pp: int = doc(1, "Pipeline-parallel degree: split the layers into M stages.")
    # e.g. "ray://head:10001" or "head:6379"
    ray_address: str | None = doc(
        None, "Join this Ray cluster (default: start a local one when tp*pp > 1)."
    )

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("tp", "pp"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.ray_address is not None and not self.ray_address.strip():
            raise ConfigError("ray_address must not be empty (leave it unset to start Ray locally)")


@dataclass(frozen=True)
class ServerConfig:
    """The daemon's sockets, telemetry and process files."""

    endpoint: str = doc("tcp://127.0.0.1:5557", "Requests and control (tcp://HOST:PORT).")
    telemetry_endpoint: str = doc(
        "tcp://127.0.0.1:5558", "Telemetry PUB (tcp://HOST:PORT)."
    )
    telemetry_hz: float = doc(10.0, "Snapshots per second (0 = off).")
    # share of wall time the job table may cost the engine thread (it is sent less often
    # than the rest of a snapshot when it would cost more)
    telemetry_job_budget: float = 0.02
    client_timeout: float = 10.0  # seconds without a message before a client's jobs are aborted
    slo_window: float = 60.0  # seconds of finished jobs in the SLO statistics
    stats_interval: float = doc(10.0, "Seconds between the log's stats lines (0 = none).")
    log_max_bytes: int = doc(16 << 20, "Log file size past which it rotates (3 old kept).")
    max_frame_bytes: int = 8 * 1024 * 1024
    curve_secret_key: str | None = None  # the daemon's key file (fsd keys generate)
    curve_authorized_dir: str | None = None  # clients' public key files allowed in
    # public key files of operators (CURVE): their requests have the operator role
    curve_operators_dir: str | None = None
    state_dir: str = doc(
        "~/.local/state/fsd", "Where the pidfile, log file and operator token go."
    )
    max_burst: int = 1000  # jobs one inline Inject burst may add
    max_client_jobs: int = 10_000  # live jobs of one client: a CURVE key, else a session
    max_jobs: int = 100_000  # live jobs in the daemon, all clients together
    max_connections: int = 4096  # open client connections; more are refused (fd-capped)
    max_connections_per_peer: int = 1024  # one peer's share: an address, or a local user
    max_inbound_bytes: int = 128 << 20  # client frames read, not yet handled; past it refused
    max_client_backlog_bytes: int = 64 << 20  # a connection's unsent replies; past it, dropped
    max_backlog_bytes: int = 1 << 30  # all connections' of an endpoint (requests, telemetry): past it the largest is dropped
    max_subscriber_backlog_bytes: int = 8 << 20  # a telemetry subscriber's unsent messages
    max_held_result_bytes: int = 256 << 20  # results kept for detached sessions, all together
    http: str | None = doc(
        None, "OpenAI-compatible API and /metrics on HOST:PORT, e.g. 127.0.0.1:8000."
    )
    # plain HTTP has no CURVE: binding it beyond loopback is refused unless this is set
    http_allow_remote: bool = False
    http_api_key: str | None = None  # when set, /v1/* wants "Authorization: Bearer KEY"
    # /metrics asks for http_api_key too (when one is set) unless this is true
    metrics_open: bool = False
    served_model_name: str | None = None  # the model's name in the API; None = as --model
    http_header_timeout: float = doc(10.0, "Seconds for a request head (and keep-alive idle).")
    http_body_timeout: float = doc(30.0, "Seconds for a request body, from its head (then 408).")
    http_max_inflight_bytes: int = doc(128 << 20, "Bytes of request bodies read at once (503).")

    def __post_init__(self) -> None:
        check_types(self)
        check_http(self)  # the address, deadlines and body budget (fsd.config_checks)
        for name in ("endpoint", "telemetry_endpoint"):
            value = getattr(self, name)
            if "://" not in value:
                raise ConfigError(f"{name} must look like tcp://HOST:PORT, got {value!r}")
        if self.telemetry_hz < 0:
            raise ConfigError(f"telemetry_hz must be >= 0 (0 turns it off), got {self.telemetry_hz}")
        if not 0.0 < self.telemetry_job_budget <= 1.0:
            raise ConfigError(f"telemetry_job_budget must be in (0, 1], got {self.telemetry_job_budget}")
        if self.client_timeout <= 0:
            raise ConfigError(f"client_timeout must be > 0 seconds, got {self.client_timeout}")
        if self.slo_window <= 0:
            raise ConfigError(f"slo_window must be > 0 seconds, got {self.slo_window}")
        if not self.stats_interval >= 0:  # also refuses NaN
            raise ConfigError(f"stats_interval must be >= 0 s (0 turns it off), got {self.stats_interval}")
        int_range("log_max_bytes", self.log_max_bytes, 4096, 1 << 40)
        int_range("max_frame_bytes", self.max_frame_bytes, 1024, 64 * 1024 * 1024)
        counts = ("max_burst", "max_client_jobs", "max_jobs", "max_connections", "max_connections_per_peer")
        for name in counts:
            int_range(name, getattr(self, name), 1, 10_000_000)
        byte_floors = {  # inbound: room for two of the largest frames, so one always passes
            "max_inbound_bytes": 2 * self.max_frame_bytes, "max_client_backlog_bytes": 1 << 20,
            "max_backlog_bytes": 1 << 20, "max_subscriber_backlog_bytes": 64 << 10,
            "max_held_result_bytes": 0,
        }  # fmt: skip
        for name, low in byte_floors.items():
            int_range(name, getattr(self, name), low, 1 << 40)


@dataclass(frozen=True)
class ClusterConfig:
    """Engine replicas behind one endpoint (each its own scheduler, KV and tp x pp GPUs)
    and the router spreading requests; its name is checked where it is built
    (fsd.router.registry), its thresholds are the `fsd` router's (bench/replicas.py)."""

    replicas: int = doc(1, "Engine replicas behind the endpoint.")
    router: str = doc("default", "How a request picks its replica (fsd.router.registry).")
    push_interval: float = doc(0.0, "Seconds between a replica's state pushes (0: each step).")
    affinity_s: float = doc(0.5, "A session keeps its replica while that costs < S s of TTFT.")
    imbalance_s: float = doc(10.0, "fsd router: least work once a replica has S s more work...")
    imbalance_ratio: float = doc(2.0, "...and this many times the least loaded one's.")

    def __post_init__(self) -> None:
        check_types(self)
        int_range("replicas", self.replicas, 1, MAX_REPLICAS)
        for name in ("push_interval", "affinity_s", "imbalance_s", "imbalance_ratio"):
            real_range(name, getattr(self, name), float(name == "imbalance_ratio"), MAX_SECONDS)


@dataclass(frozen=True)
class EngineConfig:
    """All slices of one engine."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        check_prefill_chunk(self.sched.prefill_chunk, self.cache.block_size)
        if self.model.schedule_ahead and self.parallel.tp * self.parallel.pp > 1:
            raise ConfigError("schedule_ahead needs tp = pp = 1 (in process); unset it here")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Route each keyword to the slice that has a field of that name (a policy's own
        setting, `POLICY.FIELD`, to the sched slice's `policy_settings`)."""
        slices: dict[str, dict[str, Any]] = {f.name: {} for f in dataclasses.fields(cls)}
        owners = {
            fld.name: slice_field.name
            for slice_field in dataclasses.fields(cls)
            for fld in dataclasses.fields(SLICE_TYPES[slice_field.name])
        }
        policy_settings = dict(setting_pairs(kwargs.pop("policy_settings", ())))
        for key, value in kwargs.items():
            if "." in key:  # POLICY.FIELD: a policy's own setting (fsd.sched.settings)
                policy_settings[key] = value
                continue
            if key not in owners:
                raise ConfigError(
                    f"unknown engine option {key!r}; valid options: {', '.join(sorted(owners))}"
                )
            slices[owners[key]][key] = value
        if policy_settings:
            slices["sched"]["policy_settings"] = policy_settings
        built = {
            slice_field.name: SLICE_TYPES[slice_field.name](**slices[slice_field.name])
            for slice_field in dataclasses.fields(cls)
        }
        return cls(**built)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


SLICE_TYPES: dict[str, type] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "sched": SchedConfig,
    "parallel": ParallelConfig,
}  # EngineConfig's fields and the fsd.toml tables they read
