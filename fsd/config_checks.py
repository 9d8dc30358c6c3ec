"""Bounds and validation helpers shared by the config slices (`fsd.config`)."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from collections.abc import Iterable, Mapping
from typing import Any

from fsd.errors import ConfigError

# Upper bounds of the settings a retune can change (and of the config file's values).
MAX_LEVELS = 256  # queue levels; each is a dict walked every iteration
MAX_BATCH_SIZE = 65_536  # jobs in one iteration
MAX_BATCH_TOKENS = 1 << 24  # tokens in one iteration: past any model's context
MAX_SECONDS = 86_400.0  # q1, quanta and alphas: a day is no limit for a job's turn
MAX_QUANTUM_RATIO = 1000.0  # q(k+1) / q(k)
MAX_RESERVE_JOBS = MAX_BATCH_SIZE  # K: room for more new jobs than one batch starts is moot
MAX_REPLICAS = 4096  # engine replicas behind one endpoint


def doc(default: Any, help: str) -> Any:
    """A config field with its default and its one-line help: the command lines'
    options are generated from both (fsd.cli_fields)."""
    return dataclasses.field(default=default, metadata={"help": help})


def help_of(config: type, name: str) -> str:
    """The help line a field of a config dataclass declares ("" if none)."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    return str(fields[name].metadata.get("help", ""))


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


def check_http(cfg: Any) -> None:
    """A ServerConfig's HTTP settings: the address (loopback unless http_allow_remote),
    the connection deadlines and the request-body budget (fsd.server.http.limits)."""
    if cfg.http is not None:
        host, _ = parse_http_address(cfg.http)
        if not cfg.http_allow_remote and not loopback_host(host):
            raise ConfigError(
                f"refusing to serve HTTP on {cfg.http} beyond loopback: it is unencrypted; "
                "set http_allow_remote = true (ideally with http_api_key, behind TLS)"
            )
    real_range("http_header_timeout", cfg.http_header_timeout, 0.1, MAX_SECONDS)
    real_range("http_body_timeout", cfg.http_body_timeout, 0.1, MAX_SECONDS)
    # at least one body of max_frame_bytes (a large one may use three quarters)
    int_range("http_max_inflight_bytes", cfg.http_max_inflight_bytes,
              4 * cfg.max_frame_bytes // 3 + 1, 1 << 40, " bytes")  # fmt: skip


_KINDS: dict[str, tuple[str, Any]] = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "None": ("none", lambda v: v is None),
    "tuple[tuple[str, Any], ...]": (
        "NAME=VALUE pairs",
        lambda v: isinstance(v, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in v),
    ),
    "tuple[float, ...]": (
        "a list of numbers",
        lambda v: isinstance(v, tuple | list) and all(_KINDS["float"][1](x) for x in v),
    ),
}


def check_types(config: Any) -> None:
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


def check_quanta(quanta: tuple[float, ...]) -> tuple[float, ...]:
    """Explicit per-level quanta as floats: 1..MAX_LEVELS of them, positive, bounded, rising."""
    for q in quanta:  # before float(): an int past a float's range is refused
        finite("quanta", q)
    quanta = tuple(float(q) for q in quanta)
    if not quanta:
        raise ConfigError("quanta must list at least one quantum")
    if len(quanta) > MAX_LEVELS:
        raise ConfigError(
            f"quanta must list at most {MAX_LEVELS} quanta (levels), got {len(quanta)}"
        )
    if any(q <= 0 for q in quanta):
        raise ConfigError(f"quanta must be > 0, got {list(quanta)}")
    if any(q > MAX_SECONDS for q in quanta):
        raise ConfigError(
            f"quanta must be <= {MAX_SECONDS:g} seconds (one day) each, got {max(quanta):g}"
        )
    if any(b <= a for a, b in zip(quanta, quanta[1:], strict=False)):
        raise ConfigError(f"quanta must be strictly increasing, got {list(quanta)}")
    return quanta


def setting_pairs(value: Any) -> Any:
    """A policy's settings as sorted (NAME, VALUE) pairs, the last of a name winning:
    from a mapping, pairs, or "NAME=VALUE" texts (a command line's; the value's type is
    read where the policy declares it, `fsd.sched.settings`)."""
    if value is None:  # an unset command-line option
        return ()
    if isinstance(value, Mapping):
        value = list(value.items())
    if isinstance(value, str) or not isinstance(value, Iterable):
        return value  # check_types names what it wants
    pairs: dict[str, Any] = {}
    for item in value:
        if isinstance(item, str):
            name, sep, text = item.partition("=")
            if not sep or not name.strip():
                raise ConfigError(f"policy_settings wants NAME=VALUE, got {item!r}")
            item = (name.strip(), text.strip())
        if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str):
            raise ConfigError(f"policy_settings wants (NAME, VALUE) pairs, got {item!r}")
        pairs[item[0]] = item[1]
    return tuple(sorted(pairs.items()))


def int_range(name: str, value: int, low: int, high: int, unit: str = "") -> None:
    """`value` within [low, high], or a ConfigError naming the field and both bounds."""
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low}, {high}]{unit}, got {value}")


def real_range(name: str, value: float, low: float, high: float) -> None:
    """A finite `value` within [low, high], or a ConfigError naming the field and both."""
    finite(name, value)
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low:g}, {high:g}], got {value}")


def at_most(name: str, value: float | None, high: float, unit: str = "") -> None:
    """An upper bound for an optional number (its lower bound is checked beside it)."""
    if value is not None and value > high:
        raise ConfigError(f"{name} must be <= {high:g}{unit}, got {value:g}")


def finite(name: str, value: float | None) -> None:
    """An optional number that is finite (not inf, nan, or an int past a float's range)."""
    try:
        ok = value is None or math.isfinite(value)
    except OverflowError:  # an int too large for a float (10**400)
        ok = False
    if not ok:
        raise ConfigError(f"{name} must be a finite number, got {value}")


def choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """`value` is one of `allowed`, or a ConfigError listing them."""
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def check_prefill_chunk(chunk: int | None, block_size: int) -> None:
    """A chunk holds at least one KV block (or chunking is off, or derived): the one
    cross-slice rule."""
    if chunk and chunk < block_size:
        raise ConfigError(
            f"prefill_chunk must be 0 (off) or at least one KV block ({block_size} tokens), "
            f"got {chunk}"
        )
