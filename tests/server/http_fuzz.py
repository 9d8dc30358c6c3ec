"""Fuzzed HTTP requests for the OpenAI-compatible API, shared by the CI fuzz test
(tests/server/test_http_fuzz.py) and the bench (bench/fuzz_http.py).

A case is one POST (path, headers, body). `cases()` draws them with hypothesis: random
bytes; random JSON; valid completion and chat requests with fields set to wrong types,
huge or negative integers, NaN and Infinity, deep nesting and invalid Unicode, keys
dropped or added; byte-level damage to valid bodies (truncated, spliced with NaN
literals, 5000-digit integers, invalid UTF-8); odd content types and encodings.
`send` posts one and `judge` says what its answer was: every answer must be a JSON
2xx or 4xx (a 200 stream, server-sent JSON events), never a 5xx. The one 4xx that is
not JSON is aiohttp's own, for a request its HTTP parser refuses before any route
runs (a Content-Encoding it has no codec for, such as br without Brotli).
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from hypothesis import strategies as st

# the daemon both fuzz against: a 64-token context keeps every job short whatever
# max_tokens a body asks for, and a 256 KiB body limit keeps oversized bodies cheap
MAX_BODY = 262144
DAEMON_CONFIG = f"""
[model]
max_model_len = 64
[cache]
num_gpu_blocks = 32
[server]
telemetry_hz = 5
client_timeout = 5.0
max_frame_bytes = {MAX_BODY}
"""

COMPLETION: dict[str, Any] = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
CHAT: dict[str, Any] = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 4,
}
NORMAL = json.dumps({**COMPLETION, "prompt": "ping", "max_tokens": 2, "ignore_eos": True})

# every field the routes read, and a few they ignore
KEYS = (
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "seed", "stop", "stop_token_ids", "min_tokens", "ignore_eos", "stream",
    "stream_options", "n", "logprobs", "top_logprobs", "echo", "suffix", "best_of",
    "presence_penalty", "frequency_penalty", "logit_bias", "response_format", "tools",
    "user", "metadata",
)  # fmt: skip
EDGE_INTS = (
    0, -1, 1, 2, 63, 64, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1,
    2**64, -(2**63), -(2**63) - 1, -(2**64), 10**30, -(10**30), 10**400,
)  # fmt: skip
EDGE_FLOATS = (0.0, -0.0, 1e-300, 1e-46, 5e-324, 1e308, -1e308, 2.0000001, float("nan"))
EDGE_TEXT = ("", " ", "\x00", "\ud800", "\udfff", "a\ud83d", "\u202e", "\ufeff", "\U0001f600")
ROLES = ("user", "system", "assistant", "tool", "developer", "wizard", "")
# literals spliced into a body's bytes: none is valid JSON for fsd, some not JSON at all
ATOMS = (
    b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"9" * 5000, b"-" + b"9" * 30,
    b"[" * 2000, b"{" * 50, b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b'"\\ud800"', b"\x00",
    b"null", b"true", b"[]", b"{}", b'""', b",", b":", b"}", b"]",
)  # fmt: skip
PATHS = ("/v1/completions", "/v1/chat/completions")
ODD_PATHS = ("/v1/models", "/health", "/metrics", "/v1/completions/", "/v1/chat")
CONTENT_TYPES = (
    None, "application/json", "application/json; charset=utf-8", "text/plain",
    "application/json; charset=latin-1", "application/json; charset=nope",
    "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
)  # fmt: skip
ENCODINGS = ("gzip", "deflate", "br", "identity", "nope")


@dataclass(frozen=True)
class Case:
    """One POST: where, with which headers, which body."""

    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    kind: str  # which strategy made it (for the bench's table)
    name: str = ""  # an edge case's name


# ---- strategies --------------------------------------------------------------------

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(EDGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(EDGE_FLOATS),
    st.text(max_size=12),
    st.sampled_from(EDGE_TEXT),
)
json_values = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), kids, max_size=4),
    ),
    max_leaves=10,
)


ints = st.one_of(st.integers(-2, 80), st.sampled_from(EDGE_INTS))
small_floats = st.floats(-0.5, 3.0, allow_nan=False)
# values a client might well send for each field, edge cases included; a mutation
# draws from these or from any JSON value at all
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": ints,
    "max_completion_tokens": ints,
    "min_tokens": ints,
    "top_k": st.one_of(st.integers(-2, 300), st.sampled_from(EDGE_INTS)),
    "seed": st.one_of(st.integers(-(2**65), 2**65), st.sampled_from(EDGE_INTS)),
    "temperature": st.one_of(small_floats, st.sampled_from(EDGE_FLOATS)),
    "top_p": st.one_of(st.floats(-0.1, 1.1, allow_nan=False), st.sampled_from(EDGE_FLOATS)),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3)),
    "stop_token_ids": st.lists(
        st.one_of(st.integers(-1, 300), st.sampled_from(EDGE_INTS)), max_size=4
    ),
    "prompt": st.one_of(
        st.text(max_size=40),
        st.lists(st.one_of(st.integers(-1, 300), st.sampled_from(EDGE_INTS)), max_size=8),
        st.lists(st.text(max_size=5), max_size=2),
    ),
    "ignore_eos": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "echo": st.booleans(),
    "n": st.integers(0, 3),
    "model": st.sampled_from(("tiny", "gpt-4", "")),
    "response_format": st.sampled_from(({"type": "text"}, {"type": "json_object"})),
}


def deep(depth: int, inner: Any = 1) -> Any:
    """`inner` inside `depth` lists, built without recursion."""
    for _ in range(depth):
        inner = [inner]
    return inner


@st.composite
def mutated_requests(draw: st.DrawFn) -> dict[str, Any]:
    """A valid completion or chat request with up to four things changed."""
    body = json.loads(json.dumps(draw(st.sampled_from((COMPLETION, CHAT)))))
    if draw(st.booleans()):
        body["ignore_eos"] = True
    for _ in range(draw(st.integers(0, 4))):
        op = draw(
            st.sampled_from(("plausible",) * 4 + ("any", "any", "drop", "message", "deep", "list"))
        )
        key = draw(st.sampled_from(KEYS))
        if op == "plausible":
            key = draw(st.sampled_from(sorted(PLAUSIBLE)))
            body[key] = draw(PLAUSIBLE[key])
        elif op == "any":
            body[key] = draw(json_values)
        elif op == "drop":
            body.pop(key, None)
        elif op == "deep":
            body[key] = deep(draw(st.sampled_from((31, 33, 200, 900))), draw(leaves))
        elif op == "list":  # many items: a batch of prompts, a long stop list
            body[key] = [draw(leaves)] * draw(st.sampled_from((2, 100, 5000)))
        else:
            messages = body.setdefault("messages", [{"role": "user", "content": "hi"}])
            if not isinstance(messages, list) or not messages:
                messages = body["messages"] = [{}]
            msg = messages[0] if isinstance(messages[0], dict) else {}
            messages[0] = msg
            field = draw(st.sampled_from(("role", "content", "name", "parts")))
            if field == "role":
                msg["role"] = draw(st.one_of(st.sampled_from(ROLES), json_values))
            elif field == "parts":
                part = draw(st.fixed_dictionaries({"type": st.just("text"), "text": json_values}))
                msg["content"] = [part, draw(json_values)][: draw(st.integers(1, 2))]
            else:
                msg[field] = draw(json_values)
    return body


def encode(value: Any, ascii_only: bool) -> bytes:
    """JSON as Python writes it: NaN and Infinity as literals; lone surrogates escaped,
    or (ascii_only False) encoded raw, which is not UTF-8."""
    text = json.dumps(value, allow_nan=True, ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def damaged(draw: st.DrawFn, body: bytes) -> bytes:
    """`body` with its bytes cut, spliced or overwritten."""
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(body)))
        op = draw(st.sampled_from(("cut", "atom", "atom", "bytes", "replace")))
        if op == "cut":
            body = body[:at]
        elif op == "atom":
            body = body[:at] + draw(st.sampled_from(ATOMS)) + body[at:]
        elif op == "bytes":
            body = body[:at] + draw(st.binary(min_size=1, max_size=8)) + body[at:]
        else:
            body = body[:at] + draw(st.sampled_from(ATOMS)) + body[at + draw(st.integers(1, 8)) :]
    return body


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """One fuzzed POST (see the module doc)."""
    kind = draw(
        st.sampled_from(
            ("mutated", "mutated", "mutated", "damaged", "damaged", "json", "bytes", "nested")
        )
    )
    if kind == "bytes":
        body = draw(st.binary(max_size=300))
    elif kind == "json":
        body = encode(draw(json_values), draw(st.booleans()))
    elif kind == "nested":
        depth = draw(st.sampled_from((32, 33, 999, 5000, 100_000)))
        where = draw(st.sampled_from(KEYS))
        opener, closer = draw(st.sampled_from(((b"[", b"]"), (b'{"a":', b"}"))))
        body = (
            b'{"prompt": "x", "' + where.encode() + b'": ' + opener * depth + b"1" + closer * depth
        )
        body += b"}"
    else:
        body = encode(draw(mutated_requests()), draw(st.booleans()))
        if kind == "damaged":
            body = draw(damaged(body))
    # weights by repetition: hypothesis favours the ends of an integer range
    path = draw(st.sampled_from(PATHS * 30 + ODD_PATHS))
    headers = []
    ctype = draw(st.sampled_from(CONTENT_TYPES))
    if ctype is not None:
        headers.append(("Content-Type", ctype))
    encoding = draw(st.sampled_from((None,) * 95 + ENCODINGS))
    if encoding is not None:
        headers.append(("Content-Encoding", encoding))
    return Case(path, tuple(headers), body, kind)


# ---- sending and judging -----------------------------------------------------------


@dataclass
class Answer:
    """What came back for one case."""

    status: int  # 0: no answer (the connection failed)
    content_type: str
    body: bytes


def send(base: str, case: Case, timeout: float = 120.0) -> Answer:
    """POST `case` to the server at `base` (http://HOST:PORT) on a fresh connection."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.putrequest("POST", case.path, skip_accept_encoding=True)
        for name, value in case.headers:
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(case.body)))
        conn.endheaders(case.body)
        resp = conn.getresponse()
        return Answer(resp.status, resp.getheader("Content-Type", ""), resp.read())
    except (ConnectionError, http.client.HTTPException, TimeoutError) as exc:
        return Answer(0, type(exc).__name__, b"")
    finally:
        conn.close()


def judge(answer: Answer) -> str | None:
    """None when `answer` is as every answer must be; else what is wrong with it."""
    if answer.status == 0:
        return f"no answer ({answer.content_type})"
    if answer.status >= 500:
        return f"{answer.status}: {answer.body[:300]!r}"
    if answer.content_type.startswith("text/event-stream"):
        return _judge_stream(answer)
    if answer.status >= 400 and answer.content_type.startswith("text/plain"):
        # aiohttp's HTTP parser refused the request before any route saw it (a
        # Content-Encoding it has no codec for): fsd's routes answer only JSON
        return None
    if not answer.content_type.startswith("application/json"):
        return f"{answer.status} with content type {answer.content_type!r}"
    try:
        body = json.loads(answer.body)
    except ValueError:
        return f"{answer.status} with a body that is not JSON: {answer.body[:200]!r}"
    if answer.status >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            return f"{answer.status} without an OpenAI error object: {answer.body[:200]!r}"
    elif not isinstance(body, dict):
        return f"{answer.status} with a body that is not an object"
    return None


def _judge_stream(answer: Answer) -> str | None:
    if answer.status != 200:
        return f"a stream with status {answer.status}"
    events = [e for e in answer.body.decode("utf-8", "replace").split("\n\n") if e.strip()]
    if not events or events[-1] != "data: [DONE]":
        return f"a stream that does not end with [DONE]: {answer.body[-200:]!r}"
    for event in events[:-1]:
        if not event.startswith("data: "):
            return f"a stream event that is not data: {event[:100]!r}"
        data = json.loads(event[len("data: ") :])
        error = data.get("error")
        if error is not None and error.get("type") in ("internal_error", "service_unavailable"):
            return f"a stream that failed in-band: {error}"
    return None


def normal_request(base: str) -> bool:
    """Whether a plain completion still completes (2 tokens)."""
    case = Case("/v1/completions", (("Content-Type", "application/json"),), NORMAL.encode(), "")
    answer = send(base, case)
    if answer.status != 200:
        return False
    return json.loads(answer.body)["usage"]["completion_tokens"] == 2


def edge_cases(max_body: int) -> list[Case]:
    """Fixed cases too large or too rare to leave to chance (`max_body`: the size limit)."""
    ct = (("Content-Type", "application/json"),)
    big = b'{"prompt": "' + b"x" * max_body + b'"}'
    ids = json.dumps({**COMPLETION, "prompt": list(range(1, 200_000))}).encode()
    chat = PATHS[1]
    return [
        Case(PATHS[0], ct, big, "oversized", "over-the-size-limit"),
        Case(PATHS[0], ct, b" " * (max_body - 10) + b"{}", "edge", "spaces-to-the-limit"),
        Case(PATHS[0], ct, ids, "edge", "200k-token-ids"),  # too long a prompt, not a 500
        Case(PATHS[0], (*ct, ("Content-Encoding", "gzip")), NORMAL.encode(), "edge", "gzip"),
        Case(PATHS[0], (*ct, ("Content-Encoding", "deflate")), b"\xe0", "edge", "deflate"),
        Case(PATHS[0], (*ct, ("Content-Encoding", "br")), NORMAL.encode(), "edge", "brotli"),
        Case(PATHS[0], ct, b"", "edge", "empty"),
        Case(chat, ct, b"[" * 100_000, "edge", "100k-open-brackets"),
        Case(
            chat,
            ct,
            encode({**CHAT, "messages": deep(31, CHAT["messages"])}, True),
            "edge",
            "deep-messages",
        ),
        Case(
            chat,
            ct,
            encode({**CHAT, "min_tokens": 100, "max_tokens": None}, True),
            "edge",
            "min-tokens-no-max",
        ),
        Case(
            PATHS[0], ct, encode({**COMPLETION, "stop": ["x"] * 10_000}, True), "edge", "10k-stops"
        ),
        Case(
            PATHS[0],
            ct,
            encode({**COMPLETION, "stop_token_ids": [1] * 10_000}, True),
            "edge",
            "10k-stop-ids",
        ),
        Case(
            PATHS[0], ct, encode({**COMPLETION, "prompt": "\ud800"}, False), "edge", "raw-surrogate"
        ),
    ]
