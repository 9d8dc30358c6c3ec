"""Frozen configuration slices, one per component.

Each component takes only its own slice. `EngineConfig.from_kwargs` builds all of
them from keyword arguments named after the fields, so `fsd.LLM(num_gpu_blocks=64)`
and a TOML file or CLI flag use the same names.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsd.errors import ConfigError

DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_POLICIES = ("defer", "recompute", "reactive", "proactive")
DEVICES = ("auto", "cpu", "cuda")
ATTN_BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to run and how its weights are held."""

    model: str = "tiny"
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    attn_backend: str = "auto"

    def __post_init__(self) -> None:
        _check_types(self)
        _choice("dtype", self.dtype, DTYPES)
        _choice("device", self.device, DEVICES)
        _choice("attn_backend", self.attn_backend, ATTN_BACKENDS)
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")


# Upper bounds of the settings a retune can change (and of the config file's values).
MAX_LEVELS = 256  # queue levels; each is a dict walked every iteration
MAX_BATCH_SIZE = 65_536  # jobs in one iteration
MAX_BATCH_TOKENS = 1 << 24  # tokens in one iteration: past any model's context
MAX_SECONDS = 86_400.0  # q1, quanta and alphas: a day is no limit for a job's turn
MAX_QUANTUM_RATIO = 1000.0  # q(k+1) / q(k)
MAX_RESERVE_JOBS = MAX_BATCH_SIZE  # K: room for more new jobs than one batch starts is moot


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: block size and how many blocks each tier holds."""

    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.85
    cpu_kv_bytes: int = 256 * 1024 * 1024
    num_host_blocks: int | None = None  # None: host_kv_bytes decides
    host_kv_bytes: int = 1024 * 1024 * 1024
    kv_policy: str = "proactive"
    # K = 4, K' = 2 measured better than 1, 1 on every simulated workload (bench/policies.py)
    reserve_min_jobs: int = 4  # K: free room kept for at least this many new jobs
    reserve_top_levels: int = 2  # K': ... or for every job in the top K' queues
    # a job without KV starts only while device + host use, with its blocks, stays within
    # this share of both pools (admission control: a started job always has room to go)
    admit_fraction: float = 0.9

    def __post_init__(self) -> None:
        _check_types(self)
        _choice("kv_policy", self.kv_policy, KV_POLICIES)
        if self.host_kv_bytes < 0:
            raise ConfigError(f"host_kv_bytes must be >= 0, got {self.host_kv_bytes}")
        # retunable live: each is bounded, so a retune cannot store a value that breaks
        # the planner's arithmetic or the config's msgpack encoding in telemetry
        _int_range("reserve_min_jobs (K)", self.reserve_min_jobs, 0, MAX_RESERVE_JOBS)
        _int_range("reserve_top_levels (K')", self.reserve_top_levels, 0, MAX_LEVELS)
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
        if self.cpu_kv_bytes < 1:
            raise ConfigError(f"cpu_kv_bytes must be >= 1, got {self.cpu_kv_bytes}")
        if self.num_host_blocks is not None and self.num_host_blocks < 0:
            raise ConfigError(f"num_host_blocks must be >= 0, got {self.num_host_blocks}")


@dataclass(frozen=True)
class SchedConfig:
    """Scheduling policy and batch limits."""

    policy: str = "default"
    max_batch_size: int = 32
    max_batch_tokens: int = 4096
    num_levels: int = 8
    q1: float | None = None  # seconds; None = the profile's minimum iteration time
    quantum_ratio: float = 2.0
    quanta: tuple[float, ...] | None = None  # explicit per-level quanta (strictly increasing)
    starve_limit: float | None = None  # alpha, seconds; None = 100 x the SLO (1000 decode steps)
    # alpha for a job that has not started (no output token yet); None = 8 x the SLO
    starve_limit_waiting: float | None = None
    # where a starved job goes: "up1" (one level up, fsd's default), "top" (Q1, the
    # paper) or "entry" (the level its next iteration would skip-join)
    starve_promote: str = "up1"
    # charge a prefill iteration as attained service (the paper); fsd does not: skip-join
    # already placed the job by its prefill time, so the quantum at that level is for decoding
    charge_prefill: bool = False
    # at a quantum's end: "always" demote (the paper) or, "gittins", keep the job's level
    # while recent output lengths say it is closer to done than a fresh job (fsd.sched.gittins)
    demote_rule: str = "gittins"
    # a job in the running batch is ranked this many levels above its own: a waiting job
    # preempts it only from further up (fewer swaps for a small difference in priority)
    preempt_threshold: int = 3
    profile: str | None = None  # a profile JSON path or a shipped profile name

    def __post_init__(self) -> None:
        """Types, then ranges: every value a retune may set has a lower and an upper bound."""
        _check_types(self)
        for name in ("q1", "quantum_ratio", "starve_limit", "starve_limit_waiting"):
            _finite(name, getattr(self, name))
        if self.quanta is not None:
            for q in self.quanta:  # before float(): an int past a float's range is refused
                _finite("quanta", q)
            object.__setattr__(self, "quanta", tuple(float(q) for q in self.quanta))
            if not self.quanta:
                raise ConfigError("quanta must list at least one quantum")
            if len(self.quanta) > MAX_LEVELS:
                raise ConfigError(
                    f"quanta must list at most {MAX_LEVELS} quanta (levels), got {len(self.quanta)}"
                )
            if any(q <= 0 for q in self.quanta):
                raise ConfigError(f"quanta must be > 0, got {list(self.quanta)}")
            if any(q > MAX_SECONDS for q in self.quanta):
                raise ConfigError(
                    f"quanta must be <= {MAX_SECONDS:g} seconds (one day) each, got "
                    f"{max(self.quanta):g}"
                )
            if any(b <= a for a, b in zip(self.quanta, self.quanta[1:], strict=False)):
                raise ConfigError(f"quanta must be strictly increasing, got {list(self.quanta)}")
        _choice("starve_promote", self.starve_promote, ("up1", "top", "entry"))
        _choice("demote_rule", self.demote_rule, ("always", "gittins"))
        if not 1 <= self.num_levels <= MAX_LEVELS:
            raise ConfigError(f"num_levels must be in 1..{MAX_LEVELS}, got {self.num_levels}")
        if self.q1 is not None and self.q1 <= 0:
            raise ConfigError(f"q1 must be > 0 seconds, got {self.q1}")
        _at_most("q1", self.q1, MAX_SECONDS, " seconds (one day)")
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
        _at_most("quantum_ratio", self.quantum_ratio, MAX_QUANTUM_RATIO)
        if self.starve_limit is not None and self.starve_limit <= 0:
            raise ConfigError(f"starve_limit (alpha) must be > 0 seconds, got {self.starve_limit}")
        if self.starve_limit_waiting is not None and self.starve_limit_waiting <= 0:
            raise ConfigError(
                f"starve_limit_waiting (alpha) must be > 0 seconds, got {self.starve_limit_waiting}"
            )
        for name in ("starve_limit", "starve_limit_waiting"):
            _at_most(name, getattr(self, name), MAX_SECONDS, " seconds (one day)")
        # a threshold of (levels - 1) already lifts every running job to Q1
        _int_range("preempt_threshold", self.preempt_threshold, 0, MAX_LEVELS, " levels")
        _int_range("max_batch_size", self.max_batch_size, 1, MAX_BATCH_SIZE)
        _int_range("max_batch_tokens", self.max_batch_tokens, 1, MAX_BATCH_TOKENS)


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor and pipeline parallel degrees and the Ray cluster that runs them.

    tp = pp = 1 without ray_address runs in process; anything else runs tp x pp Ray
    actors (one per GPU, or CPU actors), on the cluster at ray_address or a local one.
    """

    tp: int = 1
    pp: int = 1
    ray_address: str | None = None  # e.g. "ray://head:10001" or "head:6379"; None = start one

    def __post_init__(self) -> None:
        _check_types(self)
        for name in ("tp", "pp"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.ray_address is not None and not self.ray_address.strip():
            raise ConfigError("ray_address must not be empty (leave it unset to start Ray locally)")


@dataclass(frozen=True)
class ServerConfig:
    """The daemon's sockets, telemetry and process files."""

    endpoint: str = "tcp://127.0.0.1:5557"
    telemetry_endpoint: str = "tcp://127.0.0.1:5558"
    telemetry_hz: float = 10.0
    # share of wall time the job table may cost the engine thread (it is sent less often
    # than the rest of a snapshot when it would cost more)
    telemetry_job_budget: float = 0.02
    client_timeout: float = 10.0  # seconds without a message before a client's jobs are aborted
    slo_window: float = 60.0  # seconds of finished jobs in the SLO statistics
    max_frame_bytes: int = 8 * 1024 * 1024
    curve_secret_key: str | None = None  # the daemon's key file (fsd keys generate)
    curve_authorized_dir: str | None = None  # clients' public key files allowed in
    # public key files of operators (CURVE): their requests have the operator role
    curve_operators_dir: str | None = None
    state_dir: str = "~/.local/state/fsd"  # pidfile, log file and operator token
    max_burst: int = 1000  # jobs one inline Inject burst may add
    max_client_jobs: int = 10_000  # live jobs one connection may own (submitted + injected)
    max_jobs: int = 100_000  # live jobs in the daemon, all clients together
    http: str | None = None  # OpenAI-compatible API and /metrics on "HOST:PORT"; None = off
    # plain HTTP has no CURVE: binding it beyond loopback is refused unless this is set
    http_allow_remote: bool = False
    http_api_key: str | None = None  # when set, /v1/* wants "Authorization: Bearer KEY"
    # /metrics asks for http_api_key too (when one is set) unless this is true
    metrics_open: bool = False
    served_model_name: str | None = None  # the model's name in the API; None = as --model

    def __post_init__(self) -> None:
        _check_types(self)
        if self.http is not None:
            host, _ = parse_http_address(self.http)
            if not self.http_allow_remote and not loopback_host(host):
                raise ConfigError(
                    f"refusing to serve HTTP on {self.http} beyond loopback: it is unencrypted; "
                    "set http_allow_remote = true (ideally with http_api_key, behind TLS)"
                )
        for name in ("endpoint", "telemetry_endpoint"):
            value = getattr(self, name)
            if "://" not in value:
                raise ConfigError(f"{name} must look like tcp://HOST:PORT, got {value!r}")
        if self.telemetry_hz < 0:
            raise ConfigError(
                f"telemetry_hz must be >= 0 (0 turns it off), got {self.telemetry_hz}"
            )
        if not 0.0 < self.telemetry_job_budget <= 1.0:
            raise ConfigError(
                f"telemetry_job_budget must be in (0, 1], got {self.telemetry_job_budget}"
            )
        if self.client_timeout <= 0:
            raise ConfigError(f"client_timeout must be > 0 seconds, got {self.client_timeout}")
        if self.slo_window <= 0:
            raise ConfigError(f"slo_window must be > 0 seconds, got {self.slo_window}")
        if not 1024 <= self.max_frame_bytes <= 64 * 1024 * 1024:
            raise ConfigError(
                f"max_frame_bytes must be in [1024, 67108864], got {self.max_frame_bytes}"
            )
        for name in ("max_burst", "max_client_jobs", "max_jobs"):
            value = getattr(self, name)
            if not 1 <= value <= 10_000_000:
                raise ConfigError(f"{name} must be in [1, 10000000], got {value}")


@dataclass(frozen=True)
class EngineConfig:
    """All slices of one engine."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Route each keyword to the slice that has a field of that name."""
        slices: dict[str, dict[str, Any]] = {f.name: {} for f in dataclasses.fields(cls)}
        owners = {
            fld.name: slice_field.name
            for slice_field in dataclasses.fields(cls)
            for fld in dataclasses.fields(_slice_type(slice_field))
        }
        for key, value in kwargs.items():
            if key not in owners:
                raise ConfigError(
                    f"unknown engine option {key!r}; valid options: {', '.join(sorted(owners))}"
                )
            slices[owners[key]][key] = value
        built = {
            slice_field.name: _slice_type(slice_field)(**slices[slice_field.name])
            for slice_field in dataclasses.fields(cls)
        }
        return cls(**built)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


_SLICE_TYPES = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "sched": SchedConfig,
    "parallel": ParallelConfig,
}


def load_toml(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read fsd.toml: tables [model], [cache], [sched], [parallel], [server]."""
    p = Path(path).expanduser()
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None
    tables = {**_SLICE_TYPES, "server": ServerConfig}
    for section, values in data.items():
        if section not in tables:
            raise ConfigError(f"{p}: unknown section [{section}]; known: {', '.join(tables)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{p}: [{section}] must be a table")
        known = {f.name for f in dataclasses.fields(tables[section])}
        for key in values:
            if key not in known:
                raise ConfigError(
                    f"{p}: unknown key {key!r} in [{section}]; known: {', '.join(sorted(known))}"
                )
    return data


def build_configs(
    path: str | Path | None = None, **overrides: Any
) -> tuple[EngineConfig, ServerConfig]:
    """Engine and server configs from an optional TOML file, then keyword overrides.

    Overrides use the field names (e.g. policy="fcfs", endpoint="tcp://..."); None
    values are ignored so unset CLI flags keep the file's value.
    """
    data = load_toml(path) if path else {}
    flat: dict[str, Any] = {}
    for section in _SLICE_TYPES:
        flat.update(data.get(section, {}))
    server_kw = dict(data.get("server", {}))
    server_fields = {f.name for f in dataclasses.fields(ServerConfig)}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in server_fields:
            server_kw[key] = value
        else:
            flat[key] = value
    if "quanta" in flat and isinstance(flat["quanta"], list):
        flat["quanta"] = tuple(flat["quanta"])
    try:
        server = ServerConfig(**server_kw)
    except TypeError as exc:
        raise ConfigError(f"[server]: {exc}") from None
    return EngineConfig.from_kwargs(**flat), server


def parse_http_address(value: str) -> tuple[str, int]:
    """("127.0.0.1", 8000) from "127.0.0.1:8000" ("[::1]:8000" for IPv6)."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"http must look like HOST:PORT (e.g. 127.0.0.1:8000), got {value!r}")
    return host, int(port)


def loopback_host(host: str) -> bool:
    """Whether an HTTP host name or address stays on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve to anything: treated as remote


_KINDS: dict[str, tuple[str, Any]] = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "None": ("none", lambda v: v is None),
    "tuple[float, ...]": (
        "a list of numbers",
        lambda v: isinstance(v, tuple | list) and all(_KINDS["float"][1](x) for x in v),
    ),
}


def _check_types(config: Any) -> None:
    """Each field's value has its annotated type (TOML, CLI, wire and Python all land here).

    Why: a value of the wrong type (q1 = "5ms") would otherwise fail later inside a
    comparison with a message that names neither the field nor what it wants.
    """
    for f in dataclasses.fields(config):
        kinds = [_KINDS[k.strip()] for k in str(f.type).split("|")]
        value = getattr(config, f.name)
        if not any(ok(value) for _, ok in kinds):
            wanted = " or ".join(name for name, _ in kinds)
            raise ConfigError(f"{f.name} must be {wanted}, got {value!r}")


def _slice_type(f: dataclasses.Field) -> type:
    return _SLICE_TYPES[f.name]


def _int_range(name: str, value: int, low: int, high: int, unit: str = "") -> None:
    """`value` within [low, high], or a ConfigError naming the field and both bounds."""
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low}, {high}]{unit}, got {value}")


def _at_most(name: str, value: float | None, high: float, unit: str = "") -> None:
    """An upper bound for an optional number (its lower bound is checked beside it)."""
    if value is not None and value > high:
        raise ConfigError(f"{name} must be <= {high:g}{unit}, got {value:g}")


def _finite(name: str, value: float | None) -> None:
    try:
        finite = value is None or math.isfinite(value)
    except OverflowError:  # an int too large for a float (10**400)
        finite = False
    if not finite:
        raise ConfigError(f"{name} must be a finite number, got {value}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
