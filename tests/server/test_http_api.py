"""The OpenAI-compatible HTTP API of a real daemon, driven by the official openai client."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from fsd import protocol as P
from fsd.client import Completion
from fsd.config import ServerConfig
from fsd.config_file import build_configs
from fsd.errors import ConfigError
from fsd.server.http.api import Backend, build_app
from fsd.server.http.chat_template import PLAIN_TEMPLATE, ChatTemplate
from fsd.server.http.limits import BodyBudget
from fsd.server.http.links import LinkPool
from fsd.server.http.openai_errors import from_fsd_error
from fsd.server.http.server import exposure_warning
from fsd.server.publish.prom import MetricsCollector
from fsd.tokenizer import ByteTokenizer
from tests.server.daemon_proc import daemon_fixture

CONFIG = """
[cache]
num_gpu_blocks = 127  # 2032 tokens: less than tiny's context of 2048
[server]
telemetry_hz = 20
client_timeout = 5.0
"""


daemon = daemon_fixture(CONFIG, "http", http=True)


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """(status, JSON body) of one plain HTTP request."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def api(daemon) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{daemon.http}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()


def test_models_lists_the_daemons_model(api):
    models = api.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert api.models.retrieve("tiny").owned_by == "fsd"
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("gpt-4")


def test_completion_matches_the_sdk_and_counts_tokens(api, daemon):
    out = api.completions.create(
        model="tiny", prompt="Hello", max_tokens=7, extra_body={"ignore_eos": True}
    )
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == 5 and out.usage.completion_tokens == 7
    assert out.usage.total_tokens == 12
    with daemon.client() as c:  # greedy: the same job through the ZeroMQ SDK
        assert c.complete("Hello", max_tokens=7, ignore_eos=True).text == choice.text
    # 1e-300 passes the API's [0, 2] check; it divided the logits into inf and killed
    # the daemon's engine thread: below the greedy floor it is greedy now
    tiny = api.completions.create(
        model="tiny",
        prompt="Hello",
        max_tokens=7,
        temperature=1e-300,
        extra_body={"ignore_eos": True},
    )
    assert tiny.choices[0].text == choice.text


def test_streamed_completion_adds_up_to_the_whole_one(api):
    kw = {
        "model": "tiny",
        "prompt": "stream me",
        "max_tokens": 9,
        "extra_body": {"ignore_eos": True},
    }
    whole = api.completions.create(**kw)
    chunks = list(api.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert reasons[-1] == "length" and set(reasons[:-1]) <= {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9


def test_chat_uses_the_plain_template_for_presets(api):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    out = api.chat.completions.create(
        model="tiny", messages=messages, max_tokens=5, extra_body={"ignore_eos": True}
    )
    prompt = ChatTemplate(PLAIN_TEMPLATE).render(messages)
    assert prompt == "system: Be brief.\nuser: Hi\nassistant:"
    assert out.usage.prompt_tokens == len(prompt.encode())  # byte tokenizer: one per byte
    assert out.choices[0].message.role == "assistant"
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"
    stream = api.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=5,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == out.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": 2}, "logprobs"),
        ({"temperature": 3.5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"user": "u" * 257}, "user"),
        ({"user": ""}, "user"),
    ],
)
def test_unsupported_or_bad_parameters_are_400_naming_the_parameter(api, kwargs, param):
    kw = {"model": "tiny", "prompt": "x", "max_tokens": 2, **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        api.completions.create(**kw)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param and info.value.body["message"]


def test_refusals_map_to_openai_errors_and_the_daemon_serves_on(api, daemon):
    with pytest.raises(openai.NotFoundError) as info:
        api.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:  # longer than the context
        api.completions.create(model="tiny", prompt="x" * 3000, max_tokens=2)
    assert info.value.body["code"] == "context_length_exceeded"
    for max_tokens in (10**9, 2047):  # prompt + max_tokens past the context: named, not cut
        with pytest.raises(openai.BadRequestError) as info:
            api.completions.create(model="tiny", prompt="xy", max_tokens=max_tokens)
        assert info.value.status_code == 400
        assert info.value.body["code"] == "context_length_exceeded"
        assert "context of 2048 tokens" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        api.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        api.chat.completions.create(
            model="tiny",
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        )
    status, body = http("POST", f"{daemon.http}/v1/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = http("GET", f"{daemon.http}/v2/nothing")
    assert status == 404 and "error" in body
    status, body = http("GET", f"{daemon.http}/v1/completions")
    assert status == 405 and "error" in body
    assert http("GET", f"{daemon.http}/health")[1]["status"] == "ok"
    assert api.completions.create(model="tiny", prompt="still here", max_tokens=2).usage


def ended(daemon, reason: str = "abort") -> float:
    """vllm:request_success_total{finished_reason=reason} from /metrics."""
    with urllib.request.urlopen(f"{daemon.http}/metrics", timeout=30) as resp:
        families = text_string_to_metric_families(resp.read().decode())
        return sum(
            s.value
            for f in families
            for s in f.samples
            if s.name == "vllm:request_success_total" and s.labels["finished_reason"] == reason
        )


def aborted(daemon) -> float:
    return ended(daemon, "abort")


# a job long enough (about 14 s on a 2-core CPU) that its client's leaving is seen
# long before it could end on its own
LONG_JOB = {"prompt": "long", "max_tokens": 2000}


def why_not_aborted(daemon, lengths_before: float) -> str:
    """What a failed abort check prints: whether the job ran to its end, and the log."""
    ran_out = ended(daemon, "length") - lengths_before
    log = daemon.log.read_text(errors="replace").splitlines()[-20:]
    return f"jobs that ran to their end meanwhile: {ran_out:g}; daemon log:\n" + "\n".join(log)


def test_a_client_that_leaves_a_stream_gets_its_job_aborted(api, daemon):
    before, lengths = aborted(daemon), ended(daemon, "length")
    stream = api.completions.create(
        model="tiny", **LONG_JOB, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))
    stream.close()
    deadline = time.time() + 60
    while time.time() < deadline and aborted(daemon) == before:
        time.sleep(0.1)
    assert aborted(daemon) == before + 1, why_not_aborted(daemon, lengths)
    with daemon.client() as c:
        assert c.jobs() == []


# bodies that each answered 500 before (an exception escaped the handler)
BIG = 2**64  # one past what msgpack, the daemon's wire format, can carry
_COMPLETION = {"model": "tiny", "prompt": "x", "max_tokens": 2}


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/completions", {"max_tokens": BIG}, None),
        ("/v1/completions", {"seed": BIG}, None),
        ("/v1/completions", {"seed": -BIG}, None),
        ("/v1/completions", {"top_k": BIG}, None),
        ("/v1/completions", {"max_tokens": BIG, "min_tokens": BIG}, None),
        ("/v1/completions", {"stop_token_ids": [BIG]}, None),
        ("/v1/completions", {"prompt": [1, BIG]}, None),
        ("/v1/completions", {"prompt": [[BIG]]}, None),
        ("/v1/chat/completions", {"max_completion_tokens": BIG}, None),
        # in the range the wire carries, and still more than a parameter takes
        ("/v1/completions", {"max_tokens": 2**63}, "max_tokens"),
        ("/v1/completions", {"stop_token_ids": [2**40]}, "stop_token_ids"),
        ("/v1/completions", {"prompt": [1, 2**40]}, "prompt"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v),
)
def test_integers_too_large_are_400_not_500(daemon, path, fields, param):
    body = {**_COMPLETION, **fields}
    if path.endswith("chat/completions"):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], **fields}
    status, reply = http("POST", daemon.http + path, json.dumps(body).encode())
    assert status == 400, reply
    err = reply["error"]
    assert err["type"] == "invalid_request_error"
    if param is None:  # refused as the body is decoded: it says which number and why
        assert "out of range" in err["message"] and "2**64" in err["message"]
    else:
        assert err["param"] == param


@pytest.mark.parametrize(
    ("body", "headers", "says"),
    [
        # an unknown charset raised LookupError
        (
            json.dumps(_COMPLETION).encode(),
            {"Content-Type": "application/json; charset=nope"},
            None,
        ),
        # a lone surrogate is valid JSON, and no tokenizer or encoder takes it
        (b'{"prompt": "ab\\ud800", "max_tokens": 2}', {}, "surrogate"),
        # more digits than Python converts (ValueError)
        (b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", {}, "out of range"),
        # deeper than the JSON decoder's recursion (RecursionError)
        (b'{"prompt": "x", "user": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, "nests"),
        # NaN is no JSON value, even where it is ignored
        (b'{"prompt": "x", "max_tokens": 2, "user": NaN}', {}, "NaN"),
        (b'{"prompt": "x", "max_tokens": 2, "user": 1e400}', {}, "out of range"),
    ],
    ids=["bad-charset", "lone-surrogate", "5000-digits", "deep-nesting", "nan", "1e400"],
)
def test_bodies_fsd_cannot_read_are_400_not_500(daemon, body, headers, says):
    status, reply = http("POST", f"{daemon.http}/v1/completions", body, headers)
    if says is None:  # the charset is ignored: JSON is UTF-8
        assert status == 200 and reply["usage"]["completion_tokens"] >= 1
        return
    assert status == 400 and reply["error"]["code"] == "invalid_json"
    assert says in reply["error"]["message"]


def test_a_client_that_leaves_a_whole_completion_gets_its_job_aborted(daemon):
    """Non-streaming: nothing is written until the end, so only the closed connection
    tells; the job must not run on for nobody."""
    before, lengths = aborted(daemon), ended(daemon, "length")
    body = json.dumps({"model": "tiny", **LONG_JOB, "ignore_eos": True}).encode()
    host, port = daemon.http.removeprefix("http://").rsplit(":", 1)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with daemon.client() as c:
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(head.encode() + body)
            deadline = time.time() + 60
            while time.time() < deadline and not c.jobs():  # running now
                time.sleep(0.05)
            assert len(c.jobs()) == 1
        # the connection is closed: the job ends (aborted) without its 2000 tokens
        while time.time() < deadline and c.jobs():
            time.sleep(0.05)
        assert c.jobs() == []
    assert aborted(daemon) == before + 1, why_not_aborted(daemon, lengths)


def test_chat_without_max_tokens_fills_what_the_pool_holds(api):
    out = api.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}], extra_body={"ignore_eos": True}
    )
    assert out.usage.total_tokens == 127 * 16  # the pool, smaller than the context
    assert out.choices[0].finish_reason == "length"


def test_health_answers_ok(daemon):
    status, body = http("GET", f"{daemon.http}/health")
    assert status == 200 and body["model"] == "tiny"


# ---- without a daemon --------------------------------------------------------------


def test_http_beyond_loopback_needs_an_explicit_opt_in():
    with pytest.raises(ConfigError, match="beyond loopback"):
        ServerConfig(http="0.0.0.0:8000")
    assert ServerConfig(http="0.0.0.0:8000", http_allow_remote=True).http == "0.0.0.0:8000"
    assert ServerConfig(http="[::1]:8000").http == "[::1]:8000"
    for bad in ("8000", "127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000"):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            build_configs(None, http=bad)


def test_fsd_error_codes_map_to_http_statuses():
    assert from_fsd_error("draining", "no").status == 503
    assert from_fsd_error("too-large", "no").status == 413
    assert from_fsd_error("prompt-too-long", "no").code == "context_length_exceeded"
    assert from_fsd_error("invalid", "no").status == 400
    assert from_fsd_error("something-new", "no").status == 500


def offline_backend(**kw: Any) -> Backend:
    """A Backend for the routes that never reach the engine."""
    return Backend(
        links=LinkPool(lambda: None),  # type: ignore[arg-type,return-value]
        model="tiny",
        created=0,
        max_model_len=64,
        capacity=64,
        tokenizer=ByteTokenizer(),
        template=ChatTemplate(PLAIN_TEMPLATE),
        metrics=MetricsCollector("tiny"),
        bodies=kw.pop("bodies", BodyBudget(128 << 20, 30.0, 1 << 20)),
        **kw,
    )


def test_an_api_key_guards_v1_and_metrics_but_not_health():
    key = {"Authorization": "Bearer k3y"}

    async def run(backend: Backend, metrics_status: int) -> None:
        async with TestClient(TestServer(build_app(backend, 1 << 20))) as http:
            r = await http.get("/v1/models")
            assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
            assert (await http.get("/v1/models", headers=key)).status == 200
            r = await http.get("/metrics")
            assert r.status == metrics_status
            if r.status == 401:
                assert (await r.json())["error"]["code"] == "invalid_api_key"
            assert (await http.get("/metrics", headers=key)).status == 200
            r = await http.get("/metrics", headers={"Authorization": "Bearer wrong"})
            assert r.status == metrics_status
            r = await http.post("/v1/completions", data=b"x" * (2 << 20), headers=key)
            assert r.status == 413 and "error" in await r.json()

    asyncio.run(run(offline_backend(api_key="k3y"), 401))
    asyncio.run(run(offline_backend(api_key="k3y", metrics_open=True), 200))


class FailingJob:
    """A job handle whose job the engine ended with reason "error"."""

    prompt_tokens = 1
    job_id = "job-1"
    done = finished = True

    async def accepted(self) -> str:
        return "job-1"

    async def result(self) -> Completion:
        timings = P.Timings(arrival=0.0)
        return Completion("job-1", "r-1", "", [], "error", timings, prompt_tokens=1)

    def __aiter__(self) -> Any:
        return self._chunks()

    async def _chunks(self) -> Any:
        yield P.Chunk(req_id="r-1", job_id="job-1", token_ids=[65], text="A")


class FailingClient:
    """An engine client whose every job fails on the engine."""

    def generate(
        self, prompt: Any, params: Any = None, affinity: Any = None, owner: Any = None
    ) -> FailingJob:
        return FailingJob()


def test_a_job_the_engine_failed_is_a_500_or_an_in_band_error():
    backend = offline_backend()
    backend.links = LinkPool(FailingClient, size=1)  # type: ignore[arg-type]
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2}

    async def run() -> None:
        async with TestClient(TestServer(build_app(backend, 1 << 20))) as http:
            r = await http.post("/v1/completions", json=body)  # not "finish_reason: error"
            assert r.status == 500
            error = (await r.json())["error"]
            assert error["type"] == "internal_error" and error["code"] == "engine_error"
            r = await http.post("/v1/completions", json={**body, "stream": True})
            assert r.status == 200  # sent before the job failed: the error comes in-band
            events = (await r.text()).strip().split("\n\n")
            assert json.loads(events[0].removeprefix("data: "))["choices"][0]["text"] == "A"
            assert json.loads(events[1].removeprefix("data: "))["error"]["type"] == "internal_error"
            assert events[2:] == ["data: [DONE]"]

    asyncio.run(run())


def test_http_beyond_loopback_without_a_key_is_warned_about():
    remote = ServerConfig(http="0.0.0.0:8000", http_allow_remote=True)
    warning = exposure_warning(remote)
    assert warning is not None and "anyone who reaches the port" in warning
    keyed = ServerConfig(http="0.0.0.0:8000", http_allow_remote=True, http_api_key="k")
    assert exposure_warning(keyed) is None
    assert exposure_warning(ServerConfig(http="127.0.0.1:8000", http_allow_remote=True)) is None
    assert exposure_warning(ServerConfig()) is None
