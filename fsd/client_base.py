"""Shared pieces of the client SDK: errors, CURVE keys, results, request building.

The sync `fsd.client.Client` and the `fsd.client_async.AsyncClient` both build their
messages here (sampling validated locally through `fsd.jobs.SamplingParams`) and
route replies with `fsd.client_core.ClientCore`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
import zmq.utils.z85

from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.credentials import check_private
from fsd.errors import ConfigError, FsdError
from fsd.jobs import SamplingParams
from fsd.workload.scenario import bundle_scenario, looks_inline

log = logging.getLogger("fsd.client")

_DEFAULTS = ServerConfig()
DEFAULT_ENDPOINT = _DEFAULTS.endpoint
DEFAULT_TELEMETRY_ENDPOINT = _DEFAULTS.telemetry_endpoint
DEFAULT_TIMEOUT = _DEFAULTS.client_timeout
DEFAULT_HEARTBEAT = _DEFAULTS.client_timeout / 3
INJECT_CHECK_TIME = 30.0  # extra seconds the daemon may take to check an injected scenario


class DaemonUnavailable(FsdError, TimeoutError):
    """No fsd daemon answered at the endpoint in time (not running, hung or unreachable)."""


class RequestError(FsdError):
    """The daemon refused a request with an `Error` reply; `code` is stable."""

    def __init__(self, code: str, message: str, req_id: str | None = None) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message
        self.req_id = req_id


def unavailable(endpoint: str, timeout: float, curve: bool = False) -> DaemonUnavailable:
    hint = " (or it refused this client's CURVE key)" if curve else ""
    return DaemonUnavailable(f"no fsd daemon answered at {endpoint} within {timeout:g} s{hint}")


@dataclass(frozen=True)
class CurveKeys:
    """CURVE keys of a client: each a z85 string (40 chars) or a key file path.

    Files are those of `zmq.auth.create_certificates` / `fsd keys generate`:
    `server.key` for `server_public`, `client-1.key_secret` for `client_secret`
    (which also holds the client's public key, so `client_public` may be None).
    """

    server_public: str | Path
    client_public: str | Path | None = None
    client_secret: str | Path | None = None

    def resolve(self) -> tuple[bytes, bytes, bytes]:
        """(server public, client public, client secret) as z85 bytes."""
        server = _load_key(self.server_public, "server_public", secret=False)
        if self.client_secret is None:
            raise ConfigError("CurveKeys needs client_secret (a z85 key or a .key_secret file)")
        secret = _load_key(self.client_secret, "client_secret", secret=True)
        if self.client_public is None:
            public = zmq.curve_public(secret)
        else:
            public = _load_key(self.client_public, "client_public", secret=False)
        return server, public, secret


def apply_curve(sock: zmq.Socket, keys: tuple[bytes, bytes, bytes] | None) -> None:
    """Make `sock` a CURVE client of the daemon (`keys` from `CurveKeys.resolve`)."""
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys


def _load_key(value: str | Path, name: str, *, secret: bool) -> bytes:
    text = str(value)
    path = Path(text).expanduser()
    if len(text) == 40 and not path.exists():
        key = text.encode("ascii", "replace")
        try:
            if len(zmq.utils.z85.decode(key)) == 32:
                return key
        except (ValueError, KeyError, IndexError):
            pass
        raise ConfigError(f"{name} is neither a z85 CURVE key nor a key file: {text!r}")
    if not path.is_file():
        raise ConfigError(f"{name}: key file {str(path)!r} does not exist")
    try:
        public, secret_key = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{name}: cannot read CURVE key file {str(path)!r}: {exc}") from None
    if secret and secret_key is None:
        raise ConfigError(f"{name}: {str(path)!r} holds no secret key (use the .key_secret file)")
    if secret:
        check_private(path, f"{name}: CURVE secret key file")
    return secret_key if secret else public


@dataclass(frozen=True)
class Completion:
    """The whole result of one job, as the daemon's `Finished` reports it."""

    job_id: str
    req_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    timings: P.Timings
    prompt_tokens: int | None = None
    preemptions: int = 0
    swaps_out: int = 0
    swaps_in: int = 0
    recomputes: int = 0
    message: str | None = None  # what failed, when finish_reason is "error"

    @classmethod
    def of(cls, msg: P.Finished, prompt_tokens: int | None) -> Completion:
        return cls(
            job_id=msg.job_id,
            req_id=msg.req_id,
            text=msg.text,
            token_ids=list(msg.token_ids),
            finish_reason=msg.reason,
            timings=msg.timings,
            prompt_tokens=prompt_tokens,
            preemptions=msg.preemptions,
            swaps_out=msg.swaps_out,
            swaps_in=msg.swaps_in,
            recomputes=msg.recomputes,
            message=msg.message,
        )

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first output token."""
        t = self.timings
        if t.ttft is not None or t.first_token is None:
            return t.ttft
        return t.first_token - t.arrival

    @property
    def latency(self) -> float | None:
        t = self.timings
        if t.latency is not None or t.finish is None:
            return t.latency
        return t.finish - t.arrival

    @property
    def per_token_latency(self) -> float | None:
        """End-to-end latency divided by output tokens (the paper's metric)."""
        if self.timings.per_token_latency is not None:
            return self.timings.per_token_latency
        lat = self.latency
        return None if lat is None or not self.token_ids else lat / len(self.token_ids)

    @property
    def counts(self) -> dict[str, int]:
        """How often the scheduler preempted, swapped and recomputed this job."""
        return {f: getattr(self, f) for f in ("preemptions", "swaps_out", "swaps_in", "recomputes")}


_SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


def build_submit(
    req_id: str,
    prompt: str | Sequence[int],
    params: SamplingParams | None,
    sampling: dict[str, Any],
    tags: Sequence[str],
) -> P.Submit:
    """A `Submit`, its sampling validated locally through `SamplingParams`."""
    if params is not None and sampling:
        raise ConfigError("pass either params=SamplingParams(...) or sampling keywords, not both")
    if params is None:
        unknown = sorted(set(sampling) - set(_SAMPLING_FIELDS))
        if unknown:
            raise ConfigError(
                f"unknown sampling option {unknown[0]!r}; valid: {', '.join(_SAMPLING_FIELDS)}"
            )
        params = SamplingParams(**sampling)
    wire = P.Sampling.of(params)
    if isinstance(prompt, str):
        return P.Submit(req_id=req_id, prompt=prompt, sampling=wire, tags=list(tags))
    ids = list(prompt)
    if not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ConfigError("prompt must be a string or a non-empty list of token ids")
    return P.Submit(req_id=req_id, prompt_token_ids=ids, sampling=wire, tags=list(tags))


def build_inject(
    burst: P.Burst | Sequence[int] | dict[str, int] | None,
    scenario: str | Path | None,
    tag: str,
    req_id: str | None = None,
) -> P.Inject:
    """An `Inject` of exactly one of an inline burst and a scenario.

    A scenario given as a file (a `Path`, or a string that is not TOML text) is read
    here with the traces it names and sent inline: the daemon opens no client's path.
    """
    if (burst is None) == (scenario is None):
        raise ConfigError("inject needs exactly one of burst=(count, in, out) and scenario=")
    if burst is not None:
        return P.Inject(burst=build_burst(burst), tag=tag, req_id=req_id)
    if isinstance(scenario, str) and looks_inline(scenario):
        if len(scenario.encode()) > P.MAX_SCENARIO_BYTES:
            raise ConfigError(f"scenario text is over {P.MAX_SCENARIO_BYTES} bytes")
        return P.Inject(scenario=scenario, tag=tag, req_id=req_id)
    path = Path(str(scenario)).expanduser()
    if not path.is_file():
        raise ConfigError(f"scenario file {str(path)!r} does not exist")
    text, traces = bundle_scenario(path, P.MAX_SCENARIO_BYTES, P.MAX_TRACE_BYTES)
    return P.Inject(scenario=text, traces=traces, tag=tag, req_id=req_id)


def check_frame(frame: bytes) -> bytes:
    """Refuse here a frame the daemon could not take (it would drop the connection)."""
    if len(frame) > P.MAX_FRAME_BYTES:
        raise ConfigError(
            f"the request is {len(frame)} bytes encoded, over the protocol's "
            f"{P.MAX_FRAME_BYTES}-byte frame limit"
        )
    return frame


def build_burst(burst: P.Burst | Sequence[int] | dict[str, int]) -> P.Burst:
    if isinstance(burst, P.Burst):
        value = burst
    elif isinstance(burst, dict):
        value = P.Burst(**burst)
    else:
        count, input_len, output_len = burst
        value = P.Burst(count=count, input_len=input_len, output_len=output_len)
    if min(value.count, value.input_len, value.output_len) < 1:
        raise ConfigError(f"a burst needs count, input_len and output_len >= 1, got {value}")
    return value


def connect(
    ctx: zmq.Context, kind: int, endpoint: str, keys: tuple[bytes, bytes, bytes] | None
) -> zmq.Socket:
    """A socket of `kind` connected to `endpoint`: linger 0, CURVE client with keys."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    apply_curve(sock, keys)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        raise ConfigError(f"cannot connect to {endpoint!r}: {exc}") from None
    return sock
