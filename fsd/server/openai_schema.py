"""OpenAI request bodies → fsd sampling, fsd results → OpenAI response bodies.

Only what fsd can honour is accepted: one choice per request (n=1), no logprobs,
no penalties, no tools. Anything else is refused with a 400 naming the parameter,
rather than silently ignored, so a client never gets output that differs from what
it asked for. vLLM's extra sampling fields (top_k, min_tokens, ignore_eos,
stop_token_ids) are accepted too. Unknown fields (user, metadata, ...) are ignored,
as OpenAI's API does.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from fsd.errors import ConfigError
from fsd.jobs import SamplingParams


class APIError(Exception):
    """An error answered in OpenAI's format: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


# fsd's stable error codes (protocol Error.code) → HTTP status, OpenAI type and code
_FSD_CODES: dict[str, tuple[int, str, str | None]] = {
    "invalid": (400, "invalid_request_error", None),
    "invalid-setting": (400, "invalid_request_error", None),
    "prompt-too-long": (400, "invalid_request_error", "context_length_exceeded"),
    "too-large": (413, "invalid_request_error", "request_too_large"),
    "draining": (503, "service_unavailable", "draining"),
    "refused": (400, "invalid_request_error", None),
}


def from_fsd_error(code: str, message: str) -> APIError:
    """The HTTP form of a daemon refusal (`fsd.client.RequestError`)."""
    status, kind, oa_code = _FSD_CODES.get(code, (500, "internal_error", None))
    return APIError(status, message, kind, None, oa_code or code)


@dataclass(frozen=True)
class GenerationRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    model: str
    params: SamplingParams
    stream: bool
    include_usage: bool
    prompt: str | list[int] | None = None  # completions
    messages: list[Any] | None = None  # chat (checked by chat_template.normalize_messages)
    # chat without max_tokens: OpenAI's "as much as fits", settled once the prompt is known
    fill_max_tokens: bool = False


# parameters whose non-default values fsd cannot honour, and the value that is fine
_UNSUPPORTED = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "best_of": (None, 1),
    "n": (None, 1),
}


def parse_completion(body: Any, model: str) -> GenerationRequest:
    body = _object(body)
    prompt = _prompt(body.get("prompt"))
    params = _sampling(body, body.get("max_tokens", 16), "max_tokens")
    return GenerationRequest(
        model=_model(body, model), params=params, prompt=prompt, **_stream(body)
    )


def parse_chat(body: Any, model: str) -> GenerationRequest:
    body = _object(body)
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise bad_request("response_format other than text is not supported", "response_format")
    if "max_completion_tokens" in body and body["max_completion_tokens"] is not None:
        max_tokens, name = body["max_completion_tokens"], "max_completion_tokens"
    else:
        max_tokens, name = body.get("max_tokens"), "max_tokens"
    fill = max_tokens is None
    params = _sampling(body, 1 if fill else max_tokens, name)
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise bad_request("messages must be a non-empty list of {role, content}", "messages")
    return GenerationRequest(
        model=_model(body, model),
        params=params,
        messages=body["messages"],
        fill_max_tokens=fill,
        **_stream(body),
    )


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _model(body: dict[str, Any], served: str) -> str:
    name = body.get("model")
    if name is None:
        return served
    if name != served:
        raise APIError(
            404,
            f"The model `{name}` does not exist; this server serves `{served}`.",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    return served


def _prompt(prompt: Any) -> str | list[int]:
    # OpenAI takes a batch (a list of prompts); fsd takes one prompt per request
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request(
            "fsd takes one prompt per request; send a batch as separate requests", "prompt"
        )
    raise bad_request("prompt must be a string or a non-empty list of token ids", "prompt")


def _stream(body: dict[str, Any]) -> dict[str, bool]:
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    return {"stream": stream, "include_usage": bool((options or {}).get("include_usage"))}


def _sampling(body: dict[str, Any], max_tokens: Any, max_name: str) -> SamplingParams:
    for name, fine in _UNSUPPORTED.items():
        value = body.get(name)
        if not any(type(value) is type(f) and value == f for f in fine):  # True is not 1
            raise bad_request(
                f"{name}={value!r} is not supported by fsd", name, "unsupported_parameter"
            )
    kw: dict[str, Any] = {"max_tokens": _int(max_tokens, max_name, 1)}
    for name, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        if body.get(name) is not None:
            kw[name] = _number(body[name], name, lo, hi)
    if body.get("seed") is not None:
        kw["seed"] = _int(body["seed"], "seed", None)
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise bad_request("stop must be a non-empty string or a list of them", "stop")
        kw["stop"] = tuple(stop)
    for name in ("top_k", "min_tokens"):  # vLLM's extensions
        if body.get(name) is not None:
            kw[name] = _int(body[name], name, 0 if name == "min_tokens" else -1)
    if body.get("ignore_eos") is not None:
        if not isinstance(body["ignore_eos"], bool):
            raise bad_request("ignore_eos must be a boolean", "ignore_eos")
        kw["ignore_eos"] = body["ignore_eos"]
    if body.get("stop_token_ids") is not None:
        ids = body["stop_token_ids"]
        if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
            raise bad_request("stop_token_ids must be a list of integers", "stop_token_ids")
        kw["stop_token_ids"] = tuple(ids)
    try:
        return SamplingParams(**kw)
    except ConfigError as exc:
        field = str(exc).split(" ", 1)[0]
        raise bad_request(str(exc), field if field in kw else None) from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: Any, name: str, lo: int | None) -> int:
    if not _is_int(value) or (lo is not None and value < lo):
        floor = "" if lo is None else f" >= {lo}"
        raise bad_request(f"{name} must be an integer{floor}, got {value!r}", name)
    return int(value)


def _number(value: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise bad_request(f"{name} must be a number in [{lo:g}, {hi:g}], got {value!r}", name)
    return float(value)


# ---- responses ---------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _envelope(
    rid: str,
    obj: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    use: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The fields every completion body and stream chunk shares."""
    body: dict[str, Any] = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": choices,
    }
    if use is not None:
        body["usage"] = use
    return body


def _choice(reason: str | None, **content: Any) -> dict[str, Any]:
    return {"index": 0, **content, "logprobs": None, "finish_reason": reason}


def completion_body(
    rid: str, created: int, model: str, text: str, reason: str | None, use: dict[str, int]
) -> dict[str, Any]:
    return _envelope(rid, "text_completion", created, model, [_choice(reason, text=text)], use)


def completion_chunk(
    rid: str, created: int, model: str, text: str, reason: str | None
) -> dict[str, Any]:
    return _envelope(rid, "text_completion", created, model, [_choice(reason, text=text)])


def chat_body(
    rid: str, created: int, model: str, text: str, reason: str | None, use: dict[str, int]
) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return _envelope(
        rid, "chat.completion", created, model, [_choice(reason, message=message)], use
    )


def chat_chunk(
    rid: str, created: int, model: str, delta: dict[str, Any], reason: str | None
) -> dict[str, Any]:
    return _envelope(rid, "chat.completion.chunk", created, model, [_choice(reason, delta=delta)])


def usage_chunk(
    rid: str, created: int, model: str, obj: str, use: dict[str, int]
) -> dict[str, Any]:
    """The last chunk of a stream with stream_options.include_usage: no choices."""
    return _envelope(rid, obj, created, model, [], use)
