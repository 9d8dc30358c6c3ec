"""The OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models,
/health and /metrics (aiohttp).

Every job goes to the engine through the asyncio client SDK, so HTTP jobs pass the
same admission and validation as any other client's and the engine loop does not
know HTTP exists. Errors come back in OpenAI's format with a fitting status; once a
stream has started (status 200 sent), an error arrives as a last SSE event
`{"error": {...}}`, which the openai client raises. A client that disconnects from
a stream gets its job aborted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from fsd.client_async import AsyncClient, AsyncJobHandle
from fsd.client_base import Completion, DaemonUnavailable, RequestError
from fsd.errors import ConfigError, FsdError
from fsd.server import openai_schema as oa
from fsd.server.chat_template import ChatTemplate, normalize_messages
from fsd.server.prom import CONTENT_TYPE, MetricsCollector
from fsd.tokenizer import Tokenizer

log = logging.getLogger("fsd.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Backend:
    """What the routes need: the engine's client, the model's facts, the metrics."""

    client: AsyncClient
    model: str  # the served name
    created: int
    max_model_len: int
    capacity: int  # tokens one job can hold: the context, or the device KV pool if smaller
    tokenizer: Tokenizer
    template: ChatTemplate
    metrics: MetricsCollector
    api_key: str | None = None


BACKEND = web.AppKey("backend", Backend)


def build_app(backend: Backend, max_body: int) -> web.Application:
    """The aiohttp application serving `backend` (bodies over `max_body` bytes get 413)."""
    app = web.Application(middlewares=[_errors, _auth], client_max_size=max_body)
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
    except oa.APIError as exc:
        return _error_response(exc)
    except web.HTTPException as exc:  # unknown route, wrong method, body too large
        if exc.status < 400:
            raise
        kind = "invalid_request_error" if exc.status < 500 else "internal_error"
        message = exc.text if exc.text and exc.status != 404 else f"{exc.reason}: {request.path}"
        return _error_response(oa.APIError(exc.status, message, kind, None, None))
    except Exception as exc:  # noqa: BLE001 - a bug answers 500, the server goes on
        log.exception("%s %s failed", request.method, request.path)
        return _error_response(
            oa.APIError(500, f"{type(exc).__name__}: {exc}", "internal_error", None, None)
        )


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    key = request.app[BACKEND].api_key
    if key is not None and request.path.startswith("/v1/"):
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise oa.APIError(
                401, "Incorrect API key provided.", "invalid_request_error", None, "invalid_api_key"
            )
    return await handler(request)


def _error_response(exc: oa.APIError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise oa.bad_request(f"the request body is not valid JSON: {exc}") from None


# ---- generation --------------------------------------------------------------------


async def completions(request: web.Request) -> web.StreamResponse:
    be = request.app[BACKEND]
    req = oa.parse_completion(await _json(request), be.model)
    assert req.prompt is not None
    handle = be.client.generate(req.prompt, params=req.params)
    return await _serve(request, be, req, handle, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    be = request.app[BACKEND]
    req = oa.parse_chat(await _json(request), be.model)
    try:
        messages = normalize_messages(req.messages)
        prompt = be.template.render(messages)
    except ConfigError as exc:
        raise oa.bad_request(str(exc), "messages") from None
    # the template writes the special tokens it wants (BOS too): add none twice
    ids = be.tokenizer.encode(prompt, add_special_tokens=False)
    if not ids:
        raise oa.bad_request("the chat template rendered an empty prompt", "messages")
    params = req.params
    if req.fill_max_tokens:
        params = dataclasses.replace(params, max_tokens=max(1, be.capacity - len(ids)))
    handle = be.client.generate(ids, params=params)
    return await _serve(request, be, req, handle, chat=True)


async def _serve(
    request: web.Request, be: Backend, req: oa.GenerationRequest, handle: AsyncJobHandle, chat: bool
) -> web.StreamResponse:
    """Submit; refusals before any output are plain HTTP errors."""
    try:
        await handle.accepted()
        if not req.stream:
            return _whole(be, await handle.result(), handle, chat)
    except RequestError as exc:
        raise oa.from_fsd_error(exc.code, exc.message) from None
    except DaemonUnavailable as exc:
        raise oa.APIError(
            503, str(exc), "service_unavailable", None, "engine_unavailable"
        ) from None
    return await _stream(request, be, req, handle, chat)


def _whole(be: Backend, done: Completion, handle: AsyncJobHandle, chat: bool) -> web.Response:
    use = oa.usage(handle.prompt_tokens or 0, len(done.token_ids))
    body = oa.chat_body if chat else oa.completion_body
    rid = oa.new_id("chatcmpl" if chat else "cmpl")
    return web.json_response(body(rid, oa.now(), be.model, done.text, done.finish_reason, use))


async def _stream(
    request: web.Request, be: Backend, req: oa.GenerationRequest, handle: AsyncJobHandle, chat: bool
) -> web.StreamResponse:
    """Server-sent events: one chunk per iteration's text, a final one, then [DONE]."""
    rid, created = oa.new_id("chatcmpl" if chat else "cmpl"), oa.now()
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, reason: str | None, first: bool = False) -> dict[str, Any]:
        if not chat:
            return oa.completion_chunk(rid, created, be.model, text or "", reason)
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        return oa.chat_chunk(rid, created, be.model, delta, reason)

    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    finished = False
    try:
        if chat:
            await _event(resp, chunk(None, None, first=True))
        async for part in handle:
            if part.text:
                await _event(resp, chunk(part.text, None))
        done = await handle.result()
        finished = True
        await _event(resp, chunk(None, done.finish_reason))
        if req.include_usage:
            use = oa.usage(handle.prompt_tokens or 0, len(done.token_ids))
            await _event(resp, oa.usage_chunk(rid, created, be.model, obj, use))
    except FsdError as exc:  # the job failed mid-stream: tell the client in-band
        finished = True
        err = (
            oa.from_fsd_error(exc.code, exc.message)
            if isinstance(exc, RequestError)
            else oa.APIError(503, str(exc), "service_unavailable", None, None)
        )
        await _event(resp, err.body())
    except ConnectionError:  # the HTTP client went away (the job is aborted below)
        return resp
    finally:
        if not finished and not handle.done:  # nobody reads the rest: free the engine
            with contextlib.suppress(FsdError):
                await handle.abort()
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
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
        raise oa.APIError(
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
    try:
        st = await be.client.status()
    except FsdError as exc:
        return web.json_response({"status": "unavailable", "detail": str(exc)}, status=503)
    if st.draining:
        return web.json_response({"status": "draining"}, status=503)
    return web.json_response(
        {"status": "ok", "model": be.model, "jobs": st.jobs, "degraded": st.degraded}
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[BACKEND].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
