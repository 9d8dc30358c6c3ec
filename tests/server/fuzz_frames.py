"""Hostile and careless frames for the daemon's ROUTER, and a loop that fires them.

Used by the CI fuzz test (tests/server/test_protocol_fuzz.py) and the longer bench
(bench/fuzz_zmq.py). A frame list is one ZeroMQ message (usually one frame; some
have extra frames). Kinds: random bytes; valid messages with bytes flipped, cut or
inserted; msgpack maps of known and unknown tags with values of every type (huge
ints, NaN and inf, nesting, wrong types); invalid UTF-8 where strings go; oversized
frames. A dict item is encoded only when sent, so that `TOKEN` can stand for the
daemon's operator token (operator requests are fuzzed too, except shutdown and
drain, which would rightly stop the daemon serving).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
from hypothesis import strategies as st

from fsd import protocol as P
from fsd.sched.retune import RETUNABLE_CACHE, RETUNABLE_SCHED

TOKEN = "<operator token>"  # replaced by the daemon's token when a dict is encoded
TAGS = [
    "submit",
    "abort",
    "retune",
    "inject",
    "list_jobs",
    "get_job",
    "status",
    "drain",
    "undrain",
    "shutdown",
    "ping",
]
OPERATOR_SAFE = ["retune", "inject", "undrain", "abort", "submit", "get_job"]
FIELDS = [
    "req_id",
    "prompt",
    "prompt_token_ids",
    "sampling",
    "tags",
    "job_id",
    "changes",
    "burst",
    "scenario",
    "traces",
    "tag",
    "timeout",
    "drain",
    "token",
]
SAMPLING_FIELDS = [
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
]
RETUNABLE = [
    "policy",
    "quanta",
    "q1",
    "quantum_ratio",
    "num_levels",
    "fsd.alpha",  # a policy's own settings: each retunable alone
    "max_batch_size",
    "max_batch_tokens",
    "fsd.threshold",
    "sj-mlfq.demote",
    "kv_policy",
    "reserve_min_jobs",
    "admit_fraction",
]

VALID: list[bytes] = [
    P.encode(m)
    for m in (
        P.Submit(req_id="r1", prompt="hello", sampling=P.Sampling(max_tokens=3, temperature=0.7)),
        P.Submit(req_id="r2", prompt_token_ids=[1, 2, 3], tags=["t"]),
        P.Abort(job_id="job-1"),
        P.Retune(changes={"policy": "fcfs", "quanta": [0.01, 0.02]}),
        P.Inject(burst=P.Burst(count=2, input_len=4, output_len=3)),
        P.Inject(scenario="[scenario]\nduration = 1\n", traces={"a.csv": "x"}),
        P.ListJobs(),
        P.GetJob(job_id="job-2"),
        P.Status(),
        P.Drain(timeout=1.0),
        P.Undrain(),
        P.Shutdown(drain=False),
        P.Ping(),
    )
]

_ints = st.one_of(
    st.integers(-5, 300),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, -1, 2**31, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**64 - 1, -(2**63)]),
)
_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, 1e-46, 5e-324, 1e308, float("nan"), float("inf")]),
)
_text = st.one_of(st.text(max_size=40), st.sampled_from(["", "x" * 5000, "fcfs", "none"]))
_scalars = st.one_of(st.none(), st.booleans(), _ints, _floats, _text, st.binary(max_size=40))
VALUES = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(_text, inner, max_size=5)),
    max_leaves=20,
)


def _sampling() -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(SAMPLING_FIELDS), VALUES, max_size=5)


def _field_value(name: str) -> st.SearchStrategy[Any]:
    special = {
        "sampling": st.one_of(_sampling(), VALUES),
        "changes": st.one_of(
            st.dictionaries(st.sampled_from(RETUNABLE), VALUES, max_size=3), VALUES
        ),
        "burst": st.one_of(
            st.fixed_dictionaries(
                {
                    "count": st.integers(-2, 6),
                    "input_len": st.integers(-2, 40),
                    "output_len": st.integers(-2, 40),
                }
            ),
            VALUES,
        ),
        "prompt_token_ids": st.one_of(st.lists(_ints, max_size=20), VALUES),
        "scenario": st.one_of(
            st.sampled_from(
                [
                    "[scenario]\nduration = 1\n[[phase]]\nrate = 5\nlengths = { prompt = 4, output = 2 }\n",
                    "[scenario]\nduration = 1\n[[phase]]\narrival = 'trace'\ntrace = '/etc/passwd'\n",
                    "[scenario]\nduration = 1\n[[phase]]\narrival = 'trace'\ntrace = 'a.csv'\n",
                    "not toml [[[",
                ]
            ),
            VALUES,
        ),
        "traces": st.one_of(
            st.dictionaries(
                _text,
                st.sampled_from(["", "TIMESTAMP,ContextTokens,GeneratedTokens\n0,4,2\n", "x,y\n1"]),
                max_size=2,
            ),
            VALUES,
        ),
    }
    return special.get(name, VALUES)


@st.composite
def structured(draw: st.DrawFn, operator: bool = False) -> dict[str, Any]:
    """A msgpack map shaped like a request: a tag, a version, some fields."""
    tags = OPERATOR_SAFE if operator else TAGS
    tag = draw(st.one_of(st.sampled_from(tags), _text) if not operator else st.sampled_from(tags))
    doc: dict[str, Any] = {"type": tag}
    if draw(st.integers(0, 9)):
        doc["v"] = draw(st.one_of(st.just(P.PROTOCOL_VERSION), _ints))
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=5, unique=True)):
        doc[name] = draw(_field_value(name))
    if operator:
        doc["v"] = P.PROTOCOL_VERSION
        doc["token"] = TOKEN
    elif doc.get("token") == TOKEN:
        doc["token"] = "wrong"
    return doc


_EXTREME = st.one_of(
    _floats,
    _ints,
    st.sampled_from([[], ["x"] * 100, ["x" * 5000], [2**40], [-1], True, "1"]),
)


@st.composite
def near_valid_submit(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed submit whose sampling holds one to three extreme values."""
    sampling = {"max_tokens": draw(st.integers(1, 8))}
    for name in draw(st.lists(st.sampled_from(SAMPLING_FIELDS), min_size=1, max_size=3)):
        sampling[name] = draw(_EXTREME)
    prompt: dict[str, Any] = draw(
        st.sampled_from([{"prompt": "fuzz"}, {"prompt_token_ids": [1, 2, 3]}])
    )
    return {
        "type": "submit",
        "v": P.PROTOCOL_VERSION,
        "req_id": "n",
        **prompt,
        "sampling": sampling,
    }


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid message with a few bytes flipped, cut or inserted."""
    frame = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = draw(st.integers(0, max(0, len(frame) - 1)))
        if op == "flip" and frame:
            frame[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del frame[pos : pos + draw(st.integers(1, 8))]
        else:
            frame[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(frame)


@st.composite
def bad_utf8(draw: st.DrawFn) -> bytes:
    """A request whose tag or a string field holds bytes that are not UTF-8."""
    junk = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
    raw = msgspec.Raw(bytes([0xA0 | len(junk)]) + junk)
    where = draw(st.sampled_from(["type", "req_id", "prompt", "job_id", "tag"]))
    doc: dict[str, Any] = {"type": "submit", "v": P.PROTOCOL_VERSION, "req_id": "u", "prompt": "p"}
    doc[where] = raw
    return msgspec.msgpack.encode(doc)


def frames(max_frame_bytes: int) -> st.SearchStrategy[list[bytes | dict[str, Any]]]:
    """One message: its frames (bytes, or dicts encoded when sent)."""
    one = st.one_of(
        st.binary(max_size=120),
        mutated(),
        bad_utf8(),
        structured(),
        structured(operator=True),
        near_valid_submit(),
        st.sampled_from(VALID),
        st.sampled_from(
            [b"", b"\xc1", b"\x81\xa4type\xa1\xff", b"\x91" * 2000, b"\xdd\xff\xff\xff\xff"]
        ),
    )
    big = st.sampled_from([max_frame_bytes + 1, max_frame_bytes + 4096]).map(lambda n: b"\x90" * n)
    single = st.one_of(one, big) if max_frame_bytes else one
    return st.one_of(
        single.map(lambda f: [f]),
        single.map(lambda f: [f]),
        single.map(lambda f: [f]),
        st.lists(one, min_size=1, max_size=3),
    )


def encode_frame(frame: bytes | dict[str, Any], token: str | None) -> bytes:
    if isinstance(frame, bytes):
        return frame
    doc = dict(frame)
    if doc.get("token") == TOKEN:
        doc["token"] = token
    return msgspec.msgpack.encode(doc)


@dataclass
class FuzzStats:
    """What a fuzz run sent and got back."""

    messages: int = 0
    replies: int = 0
    undecodable_replies: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    checks: int = 0  # normal requests that completed after a batch


def fire(
    endpoint: str, batch: list[list[bytes | dict[str, Any]]], token: str | None, stats: FuzzStats
) -> None:
    """Send one batch on a fresh DEALER and read what comes back until it is quiet."""
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        for message in batch:
            parts = [encode_frame(f, token) for f in message]
            if not parts:
                continue
            s.send_multipart(parts)
            stats.messages += 1
        quiet = time.time() + 0.3
        stop = time.time() + 5.0  # fuzzed jobs may stream a while: they are reaped anyway
        while time.time() < min(quiet, stop):
            if not s.poll(50):
                continue
            quiet = time.time() + 0.3
            try:
                reply = P.decode_reply(s.recv())
            except Exception:  # noqa: BLE001 - counted, and the caller asserts on it
                stats.undecodable_replies += 1
                continue
            stats.replies += 1
            stats.codes[reply.code if isinstance(reply, P.Error) else type(reply).__name__] += 1
    finally:
        s.close()


RETUNABLE_PARTS = (("sched", RETUNABLE_SCHED), ("cache", RETUNABLE_CACHE))


def settings_of(config: dict[str, Any]) -> dict[str, Any]:
    """The retunable settings of a daemon's config (as a retune's Ack reports it), to put
    back after fuzzed retunes."""
    return {k: config[part][k] for part, keys in RETUNABLE_PARTS for k in keys}
