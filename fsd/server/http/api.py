"""The OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models,
/health and /metrics (aiohttp).

Every job goes to the engine through the asyncio client SDK, so HTTP jobs pass the
same admission and validation as any other client's and the engine loop does not
know HTTP exists. Errors come back in OpenAI's format with a fitting status; once a
stream has started (status 200 sent), an error arrives as a last SSE event
`{"error": {...}}`, which the openai client raises.

A client that disconnects gets its job aborted, streaming or not: the server runs
with aiohttp's handler cancellation, so the handler of a request whose connection
closed is cancelled wherever it waits, and `_serve` aborts the job it leaves behind.
Each request runs on one of a few engine links (`links`); a link that fails
fails only the requests on it (503), and is replaced. Bodies are read under a
deadline and a byte budget shared by all connections (`limits`).

Nothing a body holds answers 500: it is decoded strictly (`openai_decode.decode_body`)
and checked field by field, and whatever fsd cannot take is a 4xx. A 500 means fsd
failed (a job the engine ended with an error, or a bug), never the client.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from fsd.client import AsyncJobHandle, Completion, DaemonUnavailable, RequestError
from fsd.errors import ConfigError
from fsd.jobs import SamplingParams
from fsd.server.http import openai_response as reply
from fsd.server.http import openai_schema as oa
from fsd.server.http.chat_template import ChatTemplate, normalize_messages
from fsd.server.http.idle import IdleConnections
from fsd.server.http.limits import BodyBudget, BodyError, read_body
from fsd.server.http.links import LINK_ERRORS, Link, LinkPool, link_failed
from fsd.server.http.openai_decode import decode_body
from fsd.server.http.openai_errors import APIError, bad_request, from_fsd_error, job_failed
from fsd.server.publish.prom import CONTENT_TYPE, MetricsCollector
from fsd.tokenizer import Tokenizer

log = logging.getLogger("fsd.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Backend:
    """What the routes need: the engine's links, the model's facts, the metrics."""

    links: LinkPool
    model: str  # the served name
    created: int
    max_model_len: int
    capacity: int  # tokens one job can hold: the context, or the device KV pool if smaller
    tokenizer: Tokenizer
    template: ChatTemplate
    metrics: MetricsCollector
    bodies: BodyBudget  # the request bodies being read: deadline and byte budget
    api_key: str | None = None
    metrics_open: bool = False  # /metrics without the API key even when one is set
    vocab_size: int | None = None  # token ids in prompts and stop_token_ids stay below it
    # seconds a request waits for the engine to take it (then 503; its job is aborted):
    # the link itself never times out, so it never gives up the jobs it owns
    accept_timeout: float = 10.0


BACKEND = web.AppKey("backend", Backend)


def build_app(
    backend: Backend, max_body: int, idle: IdleConnections | None = None
) -> web.Application:
    """The aiohttp application serving `backend` (bodies over `max_body` bytes get 413);
    `idle` learns which connections have a request in progress."""
    first = [idle.middleware()] if idle is not None else []
    app = web.Application(middlewares=[*first, _errors, _auth], client_max_size=max_body)
    app[BACKEND] = backend
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


# ---- middlewares -------------------------------------------------------------------


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as an OpenAI error body; the daemon never dies of a request."""
    try:
        return await handler(request)
    except APIError as exc:
        resp = _error_response(exc)
        if isinstance(exc, BodyError):  # Retry-After; or a 408 that closes the connection
            await exc.answer(request, resp)
        return resp
    except web.HTTPException as exc:  # unknown route, wrong method, body too large
        if exc.status < 400:
            raise
        kind = "invalid_request_error" if exc.status < 500 else "internal_error"
        message = exc.text if exc.text and exc.status != 404 else f"{exc.reason}: {request.path}"
        return _error_response(APIError(exc.status, message, kind, None, None))
    except Exception as exc:  # noqa: BLE001 - a bug answers 500, the server goes on
        log.exception("%s %s failed", request.method, request.path)
        return _error_response(
            APIError(500, f"{type(exc).__name__}: {exc}", "internal_error", None, None)
        )


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The API key guards /v1/* and /metrics (unless metrics_open); /health stays open."""
    be = request.app[BACKEND]
    key = be.api_key
    guarded = request.path.startswith("/v1/") or (
        request.path == "/metrics" and not be.metrics_open
    )
    if key is not None and guarded:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise APIError(
                401, "Incorrect API key provided.", "invalid_request_error", None, "invalid_api_key"
            )
    return await handler(request)


def _error_response(exc: APIError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, headers=exc.headers)


async def _json(request: web.Request) -> Any:
    # the bytes, not request.json(): a body's charset parameter (an unknown one raised
    # LookupError) does not decide how JSON is read
    return decode_body(await read_body(request, request.app[BACKEND].bodies))


# ---- generation --------------------------------------------------------------------


async def completions(request: web.Request) -> web.StreamResponse:
    be = request.app[BACKEND]
    req = oa.parse_completion(await _json(request), be.model, be.vocab_size)
    assert req.prompt is not None
    return await _serve(request, be, req, req.prompt, req.params, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    be = request.app[BACKEND]
    req = oa.parse_chat(await _json(request), be.model, be.vocab_size)
    try:
        messages = normalize_messages(req.messages)
        prompt = be.template.render(messages)
    except ConfigError as exc:
        raise bad_request(str(exc), "messages") from None
    # the template writes the special tokens it wants (BOS too): add none twice
    ids = be.tokenizer.encode(prompt, add_special_tokens=False)
    if not ids:
        raise bad_request("the chat template rendered an empty prompt", "messages")
    params = req.params
    if req.fill_max_tokens:
        params = oa.fill_max_tokens(params, be.capacity - len(ids))
    return await _serve(request, be, req, ids, params, chat=True)


def _generate(
    link: Link, prompt: str | Sequence[int], params: SamplingParams, user: str | None, peer: str
) -> AsyncJobHandle:
    """The job's handle (not sent yet); what the wire cannot carry is a 400, not a 500.
    Its owner is its peer's address: HTTP users take turns by address (the `user`
    field, which anyone may set, keeps a user's jobs on one replica only)."""
    try:
        return link.client.generate(prompt, params=params, affinity=user, owner=f"http:{peer}")
    except ConfigError as exc:
        raise bad_request(str(exc)) from None
    except (OverflowError, UnicodeError) as exc:  # the schema's checks should leave none
        raise bad_request(f"the request cannot be sent to the engine: {exc}") from None


async def _serve(
    request: web.Request,
    be: Backend,
    req: oa.GenerationRequest,
    prompt: str | Sequence[int],
    params: SamplingParams,
    chat: bool,
) -> web.StreamResponse:
    """Submit on the least busy link and answer.

    However the handler ends (its client gone and the handler cancelled, a stream cut
    short, a bug), a job it leaves unfinished is aborted: the engine does not go on
    generating for a client that has left.
    """
    link = be.links.pick()
    try:
        handle = _generate(link, prompt, params, req.user, request.remote or "?")
        try:
            return await _answer(request, be, link, req, handle, chat)
        finally:
            be.links.abandon(link, handle)
    finally:
        be.links.release(link)


async def _answer(
    request: web.Request,
    be: Backend,
    link: Link,
    req: oa.GenerationRequest,
    handle: AsyncJobHandle,
    chat: bool,
) -> web.StreamResponse:
    """Refusals before any output are plain HTTP errors; then the stream or the whole."""
    try:
        try:
            await asyncio.wait_for(handle.accepted(), be.accept_timeout)
        except TimeoutError:
            raise APIError(
                503,
                f"the engine did not take the request within {be.accept_timeout:g} s; "
                "it is overloaded, retry later",
                "service_unavailable",
                None,
                "engine_overloaded",
            ) from None
        if not req.stream:
            return _whole(be, await handle.result(), handle, chat)
    except LINK_ERRORS as exc:
        raise _engine_error(be, link, exc) from None
    return await _stream(request, be, link, req, handle, chat)


def _engine_error(be: Backend, link: Link, exc: BaseException) -> APIError:
    """The HTTP form of a link's error: the daemon's refusal, or the link failed
    (503; the link is replaced, and only the requests on it fail)."""
    if isinstance(exc, RequestError) and not link_failed(exc):
        return from_fsd_error(exc.code, exc.message, exc.retry_after)
    be.links.retire(link, exc)
    code = "engine_unavailable" if isinstance(exc, DaemonUnavailable) else "engine_link_failed"
    return APIError(503, f"{exc} (the engine link failed; retry)", "service_unavailable", None, code)


def _whole(be: Backend, done: Completion, handle: AsyncJobHandle, chat: bool) -> web.Response:
    if done.finish_reason == "error":
        raise job_failed(done.message)
    use = _usage(handle, done)
    body = reply.chat_body if chat else reply.completion_body
    rid = reply.new_id("chatcmpl" if chat else "cmpl")
    return web.json_response(body(rid, reply.now(), be.model, done.text, done.finish_reason, use))


def _usage(handle: AsyncJobHandle, done: Completion) -> dict[str, Any]:
    """The job's usage, its prompt tokens found in the prefix cache included."""
    return reply.usage(handle.prompt_tokens or 0, len(done.token_ids), done.cached_tokens)


async def _stream(
    request: web.Request, be: Backend, link: Link,
    req: oa.GenerationRequest, handle: AsyncJobHandle, chat: bool,
) -> web.StreamResponse:  # fmt: skip
    """Server-sent events: one chunk per iteration's text, a final one, then [DONE]."""
    rid, created = reply.new_id("chatcmpl" if chat else "cmpl"), reply.now()
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, reason: str | None, first: bool = False) -> dict[str, Any]:
        if not chat:
            return reply.completion_chunk(rid, created, be.model, text or "", reason)
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        return reply.chat_chunk(rid, created, be.model, delta, reason)

    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    try:
        await resp.prepare(request)
        try:
            if chat:
                await _event(resp, chunk(None, None, first=True))
            async for part in handle:
                if part.text:
                    await _event(resp, chunk(part.text, None))
            done = await handle.result()
            if done.finish_reason == "error":
                await _event(resp, job_failed(done.message).body())
            else:
                await _event(resp, chunk(None, done.finish_reason))
                if req.include_usage:
                    use = _usage(handle, done)
                    await _event(resp, reply.usage_chunk(rid, created, be.model, obj, use))
        except LINK_ERRORS as exc:  # the job failed mid-stream: tell the client in-band
            await _event(resp, _engine_error(be, link, exc).body())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionError:  # the HTTP client went away (`_serve` aborts the job)
        pass
    return resp


async def _event(resp: web.StreamResponse, data: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n")


# ---- models, health, metrics -------------------------------------------------------


def _model_card(be: Backend) -> dict[str, Any]:
    return {
        "id": be.model,
        "object": "model",
        "created": be.created,
        "owned_by": "fsd",
        "max_model_len": be.max_model_len,
    }


async def list_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_card(request.app[BACKEND])]})


async def get_model(request: web.Request) -> web.Response:
    be = request.app[BACKEND]
    name = request.match_info["model"]
    if name != be.model:
        raise APIError(
            404,
            f"The model `{name}` does not exist.",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    return web.json_response(_model_card(be))


async def health(request: web.Request) -> web.Response:
    """200 while the engine answers and takes jobs; 503 when draining or unreachable."""
    be = request.app[BACKEND]
    link = be.links.pick()
    try:
        st = await asyncio.wait_for(link.client.status(), be.accept_timeout)
    except TimeoutError:
        detail = f"the engine did not answer within {be.accept_timeout:g} s"
        return web.json_response({"status": "unavailable", "detail": detail}, status=503)
    except LINK_ERRORS as exc:
        detail = _engine_error(be, link, exc).message
        return web.json_response({"status": "unavailable", "detail": detail}, status=503)
    finally:
        be.links.release(link)
    if st.draining:
        return web.json_response({"status": "draining"}, status=503)
    return web.json_response(
        {"status": "ok", "model": be.model, "jobs": st.jobs, "degraded": st.degraded}
    )


async def metrics(request: web.Request) -> web.Response:
    """The Prometheus exposition (behind the API key unless metrics_open)."""
    body = request.app[BACKEND].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
