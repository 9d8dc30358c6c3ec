"""Every message on fsd's sockets: msgspec Structs, one tagged union, one version.

Requests and control travel DEALER → ROUTER as one msgpack frame each; the daemon
answers on the same connection. Telemetry is PUB/SUB with two frames: a topic
(`snapshot` or `event`) and the msgpack payload. Nothing is ever pickled: a frame
that does not decode to a known message of this version gets an `Error` back.

Roles: every request may carry the operator `token` (the daemon's token file, see
fsd.credentials). Submitting, reading and aborting one's own jobs need no role;
retune, inject, drain, undrain, shutdown and aborting another client's job need the
operator role (the token, or a CURVE key listed as an operator).

Version 2: levels are 1-based everywhere (Q1 is the top level), `token`, `Undrain`,
`Finished.message`, `StatusReply.role`, and `Inject` carries a scenario's text and
its traces inline (the daemon never opens a path a client names).

Sessions (still version 2: a request's optional `session`, and `Hello`/`Welcome`,
which only a client that says Hello ever receives): who owns a job is its session,
never a routing id. A client that says `Hello` gets its session's secret in the
`Welcome`; presenting it in a later `Hello` from a new connection resumes the
session's jobs there, and a request carrying another session's secret is refused
("bad-session"). A client that never says Hello has an anonymous session bound to
its connection (the gate issues every connection its own routing id).

The version, the size limits, `encode` and `ProtocolError` (an `FsdError` whose
instances carry their code) live in `fsd.wire`, the telemetry messages and `JobInfo`
in `fsd.protocol_telemetry`, the what-if pair (`Preview`, `PreviewReply`) in
`fsd.protocol_preview`; all are re-exported here.

Within a version, a message grows only by optional fields (a None or empty default):
an older peer skips what it does not know and a newer one reads an absent field as
its default (`JobInfo.prefilled`, `rank` and `cached_tokens`, `Snapshot.sched` and
`prefix`, `Finished.cached_tokens`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from fsd.jobs import SamplingParams, shared_params
from fsd.protocol_preview import (  # noqa: F401 - re-exported: the what-if messages
    Preview,
    PreviewAssumptions,
    PreviewReply,
    PreviewSide,
    Spread,
)
from fsd.protocol_telemetry import (  # noqa: F401 - re-exported: the telemetry messages
    Event,
    IterationInfo,
    JobInfo,
    KVInfo,
    LearnedInfo,
    LevelInfo,
    PrefixInfo,
    ReplicaInfo,
    RouteInfo,
    SchedInfo,
    SLOInfo,
    Snapshot,
)
from fsd.token_chunk import Chunk  # noqa: F401 - re-exported: made by the engine
from fsd.wire import (  # noqa: F401 - re-exported: code reads the wire as fsd.protocol
    DEFAULT_ENDPOINT,
    DEFAULT_TELEMETRY_ENDPOINT,
    MAX_FRAME_BYTES,
    MAX_SCENARIO_BYTES,
    MAX_TRACE_BYTES,
    PROTOCOL_VERSION,
    TOPIC_EVENT,
    TOPIC_SNAPSHOT,
    ProtocolError,
    check_version,
    decode_strict,
    encode,
)


class _Msg(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    v: int = PROTOCOL_VERSION


class _Req(_Msg, kw_only=True):
    """A client's request; `token` claims the operator role (see the module doc) and
    `session` is the secret of the connection's session (its `Welcome`), checked when
    present."""

    token: str | None = None
    session: str | None = None


# ---- client → daemon ---------------------------------------------------------------


class Sampling(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Sampling parameters, as fsd.SamplingParams."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    min_tokens: int = 0

    @classmethod
    def of(cls, params: SamplingParams) -> Sampling:
        """The wire form of validated sampling parameters (same field names)."""
        fields = dataclasses.asdict(params)
        return cls(**{k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()})

    def params(self) -> SamplingParams:
        """Validate into SamplingParams (raises ConfigError naming a bad field); equal
        settings give the same object (`fsd.jobs.shared_params`)."""
        return shared_params(SamplingParams(**msgspec.structs.asdict(self)))


class Submit(_Req, tag="submit"):
    """A generation request; exactly one of `prompt` and `prompt_token_ids`."""

    req_id: str
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    tags: list[str] = []
    # requests of one affinity key (a user, a conversation) stay on one replica while
    # its load allows (fsd.cluster); at most MAX_AFFINITY_CHARS
    affinity: str | None = None
    # whose job it is, for the job caps and the turns clients take (operators only: a
    # relay such as the HTTP API names the user it serves); at most MAX_AFFINITY_CHARS
    owner: str | None = None


MAX_AFFINITY_CHARS = 256


class Abort(_Req, tag="abort"):
    job_id: str


class Retune(_Req, tag="retune"):
    """Scheduling settings to change (names as in fsd.toml's [sched] and KV policy keys)."""

    changes: dict[str, Any]
    replica: int | None = None  # one replica of a daemon that runs several (None: all)


class Burst(msgspec.Struct, kw_only=True):
    """An inline burst: `count` jobs of the given input and output lengths."""

    count: int
    input_len: int
    output_len: int


class Inject(_Req, tag="inject"):
    """Inject tagged jobs: an inline burst, or a scenario's TOML text.

    `traces` maps each trace name the scenario's phases use (`trace = "NAME"`) to the
    trace's CSV text: the client reads its files and the daemon opens none.
    """

    burst: Burst | None = None
    scenario: str | None = None
    traces: dict[str, str] = {}
    tag: str = "injected"
    req_id: str | None = None  # echoed in the Ack or Error (a scenario is answered late)


class ListJobs(_Req, tag="list_jobs"):
    pass


class GetJob(_Req, tag="get_job"):
    job_id: str


class Status(_Req, tag="status"):
    pass


class Drain(_Req, tag="drain"):
    """Stop accepting jobs; answer once in-flight jobs end or `timeout` passes."""

    timeout: float = 30.0
    # one replica of several: it takes no new jobs and its jobs move to the others
    # (answered at once with how many moved); None: the whole daemon
    replica: int | None = None


class Undrain(_Req, tag="undrain"):
    """Accept jobs again after a drain (not after a shutdown began)."""

    replica: int | None = None  # one replica of several (None: the whole daemon)


class Shutdown(_Req, tag="shutdown"):
    drain: bool = True
    timeout: float = 30.0


class Ping(_Req, tag="ping"):
    """Heartbeat: a client that stops sending loses its jobs after the daemon's timeout."""


class Hello(_Req, tag="hello"):
    """A connection's first request: answered by a `Welcome` with the session's secret.

    With `session` (the secret of an earlier connection's `Welcome`) the daemon moves
    that session, its live jobs and its undelivered results, to this connection.
    """


Request = (
    Submit
    | Abort
    | Retune
    | Inject
    | ListJobs
    | GetJob
    | Status
    | Drain
    | Undrain
    | Shutdown
    | Ping
    | Preview
    | Hello
)


# ---- daemon → client ---------------------------------------------------------------


class Accepted(_Msg, tag="accepted"):
    """The job is queued. A client must send something (a Ping will do) at least every
    `client_timeout` seconds while it has jobs, or the daemon aborts them."""

    req_id: str
    job_id: str
    prompt_tokens: int
    client_timeout: float = 0.0


class Tokens(_Msg, tag="tokens"):
    """What one iteration produced for this client's jobs."""

    chunks: list[Chunk]


class Timings(msgspec.Struct, kw_only=True, omit_defaults=True):
    arrival: float
    first_token: float | None = None
    finish: float | None = None
    ttft: float | None = None
    latency: float | None = None
    per_token_latency: float | None = None
    token_times: list[float] = []


class Finished(_Msg, tag="finished"):
    """A job ended: reason stop, length, abort or error (`message` says what failed).

    `cached_tokens`: prompt tokens its first prefill reused from the prefix cache.
    """

    req_id: str
    job_id: str
    reason: str
    text: str
    token_ids: list[int]
    timings: Timings
    preemptions: int = 0
    swaps_out: int = 0
    swaps_in: int = 0
    recomputes: int = 0
    message: str | None = None
    cached_tokens: int = 0


class Error(_Msg, tag="error"):
    """Something was refused; `code` is stable, `message` says why in plain words;
    `retry_after`: seconds after which a retry may be taken (an overload refusal's)."""

    code: str
    message: str
    req_id: str | None = None
    retry_after: float | None = None


class JobList(_Msg, tag="job_list"):
    jobs: list[JobInfo]


class JobReply(_Msg, tag="job"):
    job: JobInfo


class StatusReply(_Msg, tag="status_reply"):
    pid: int
    version: str
    model: str
    policy: str
    kv_policy: str
    uptime: float
    jobs: int
    running: int
    iterations: int
    draining: bool
    degraded: str | None = None
    client_timeout: float = 0.0
    step_seconds: float = 0.0  # engine-thread time in iterations (step + routing tokens)
    telemetry_seconds: float = 0.0  # engine-thread time reading and queueing telemetry
    preview_seconds: float = 0.0  # engine-thread time snapshotting for previews
    role: str = "client"  # the role the asking request had: "client" or "operator"
    max_model_len: int = 0  # the model's context in tokens (0: not reported)
    replicas: int = 1  # engine replicas behind the endpoint (fsd.cluster)


class Ack(_Msg, tag="ack"):
    """A control request succeeded; `detail` carries its result (new config, job ids...)."""

    what: str
    detail: dict[str, Any] = {}
    req_id: str | None = None  # the request's, when it had one (Inject)


class Welcome(_Msg, tag="welcome"):
    """The answer to `Hello`: this connection's session and its secret.

    `resumed`: the Hello's session was found and now lives on this connection; `jobs`
    are its req_ids still live or with a `Finished` on its way (sent right after);
    `dropped`: req_ids of jobs that finished while it was away whose results the
    daemon could not keep (past `max_held_result_bytes`).
    A Hello whose session is unknown (expired, or another daemon's) gets a new one.
    """

    session: str
    resumed: bool = False
    jobs: list[str] = []
    dropped: list[str] = []


Reply = (
    Accepted
    | Tokens
    | Finished
    | Error
    | JobList
    | JobReply
    | StatusReply
    | Ack
    | PreviewReply
    | Welcome
)


# ---- codecs (fsd.wire) ---------------------------------------------------------------

_request_decoder = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_snapshot_decoder = msgspec.msgpack.Decoder(Snapshot)
_event_decoder = msgspec.msgpack.Decoder(Event)


def decode_request(frame: bytes) -> Request:
    """Decode a client frame or raise ProtocolError with a stable code (any failure)."""
    return decode_strict(_request_decoder, frame)


def decode_reply(frame: bytes) -> Reply:
    return check_version(_reply_decoder.decode(frame))


def decode_snapshot(frame: bytes) -> Snapshot:
    return check_version(_snapshot_decoder.decode(frame))


def decode_event(frame: bytes) -> Event:
    return check_version(_event_decoder.decode(frame))
