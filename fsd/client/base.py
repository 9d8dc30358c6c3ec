"""Shared pieces of the client SDK: defaults, the arguments of a client, the result of
a job, request building.

The `AsyncClient` builds its messages here (sampling validated locally through
`fsd.jobs.SamplingParams`, a scenario file read and sent inline) and routes the
replies with `fsd.client.core.ClientCore`; the sync `Client` runs one.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

import zmq

from fsd import protocol as P
from fsd.client.keys import CurveKeys
from fsd.errors import ConfigError
from fsd.jobs import SamplingParams
from fsd.workload.scenario import bundle_scenario, looks_inline

log = logging.getLogger("fsd.client")

DEFAULT_TIMEOUT = 10.0  # seconds to wait for an answer: the daemon's default client_timeout
DEFAULT_HEARTBEAT = DEFAULT_TIMEOUT / 3  # a Ping well inside the daemon's patience
INJECT_CHECK_TIME = 30.0  # extra seconds the daemon may take to check an injected scenario
PREVIEW_TIME = 300.0  # extra seconds a preview may take: its twin runs (any horizon)

_Ctx = TypeVar("_Ctx", bound=zmq.Context)


class ClientBase(ABC, Generic[_Ctx]):
    """A client of one fsd daemon at `endpoint`: what `Client` and `AsyncClient` take.

    `timeout`: seconds to wait for any answer before `DaemonUnavailable`;
    `heartbeat`: seconds between `Ping`s while jobs are outstanding (default: a
    third of the daemon's default client_timeout); `curve`: `CurveKeys` when the
    daemon requires CURVE; `token`: the operator token, for the operator role
    (`fsd.credentials.find_operator_token` reads the daemon's token file);
    `context`: the ZeroMQ context (default: the process's); `affinity`: the key every
    request carries unless it names its own (a daemon of several replicas keeps the
    requests of one key, a user or a conversation, on one replica while its load allows).
    """

    def __init__(
        self,
        endpoint: str = P.DEFAULT_ENDPOINT,
        timeout: float = DEFAULT_TIMEOUT,
        curve: CurveKeys | None = None,
        heartbeat: float | None = None,
        token: str | None = None,
        context: _Ctx | None = None,
        affinity: str | None = None,
    ) -> None:
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        self.endpoint = endpoint
        self.timeout = timeout
        self._curve = curve
        self._heartbeat = heartbeat or DEFAULT_HEARTBEAT
        self._token = token
        self.affinity = affinity
        self._setup(context)

    @abstractmethod
    def _setup(self, context: _Ctx | None) -> None:
        """The flavour's own parts, made once the arguments are checked and kept."""


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
    cached_tokens: int = 0  # prompt tokens its first prefill reused from the prefix cache

    @classmethod
    def of(cls, msg: P.Finished, prompt_tokens: int | None) -> Completion:
        same = {name: getattr(msg, name) for name in _AS_FINISHED}
        return cls(
            **same,
            token_ids=list(msg.token_ids),
            finish_reason=msg.reason,
            prompt_tokens=prompt_tokens,
        )

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first output token."""
        t = self.timings
        return _reported_or_since(t.ttft, t.first_token, t.arrival)

    @property
    def latency(self) -> float | None:
        t = self.timings
        return _reported_or_since(t.latency, t.finish, t.arrival)

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
        return {f: getattr(self, f) for f in _COUNTS}


_COUNTS = ("preemptions", "swaps_out", "swaps_in", "recomputes")
# what a Completion takes from the Finished as it is
_AS_FINISHED = ("job_id", "req_id", "text", "timings", "message", "cached_tokens", *_COUNTS)


def _reported_or_since(reported: float | None, at: float | None, arrival: float) -> float | None:
    """A duration as the daemon reported it, else from `arrival` to `at` (if known)."""
    if reported is not None or at is None:
        return reported
    return at - arrival


class Closes(ABC):
    """`with obj:` closes `obj` on the way out."""

    @abstractmethod
    def close(self) -> None:
        """Release what this object holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


def build_submit(
    req_id: str,
    prompt: str | Sequence[int],
    params: SamplingParams | None,
    sampling: dict[str, Any],
    tags: Sequence[str],
    affinity: str | None = None,
    owner: str | None = None,
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
    common = {"req_id": req_id, "sampling": wire, "tags": list(tags)}
    if isinstance(prompt, str):
        return P.Submit(prompt=prompt, affinity=affinity, owner=owner, **common)
    ids = list(prompt)
    if not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ConfigError("prompt must be a string or a non-empty list of token ids")
    return P.Submit(prompt_token_ids=ids, affinity=affinity, owner=owner, **common)


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


def build_preview(
    changes: dict[str, Any], horizon: float, seeds: int, req_id: str | None
) -> P.Preview:
    """A `Preview` of `changes` (the daemon checks keys, values, horizon and seeds)."""
    if not changes:
        raise ConfigError("preview needs at least one setting, e.g. policy='fcfs'")
    return P.Preview(changes=changes, horizon=horizon, seeds=seeds, req_id=req_id)


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
