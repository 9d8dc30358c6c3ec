"""OpenAI request bodies → fsd sampling (`parse_completion`, `parse_chat`).

Only what fsd can honour is accepted: one choice per request (n=1), no logprobs,
no penalties, no tools. Anything else is refused with a 400 naming the parameter,
rather than silently ignored, so a client never gets output that differs from what
it asked for. vLLM's extra sampling fields (top_k, min_tokens, ignore_eos,
stop_token_ids) are accepted too; `user` is the affinity key (a daemon of several
replicas keeps one user's requests together). Unknown fields (metadata, ...) are
ignored, as OpenAI's API does.

A body reaches these parsers already decoded strictly (`openai_decode.decode_body`);
errors are built in `openai_errors`, responses in `openai_response`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fsd.errors import ConfigError
from fsd.jobs import MAX_SEED, MAX_TEMPERATURE, SamplingParams
from fsd.server.http.openai_errors import APIError, bad_request, clip, show

INT64_MAX = 2**63 - 1  # the bound of the integer parameters (vLLM's torch.long range)


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
    user: str | None = None  # OpenAI's end-user id: the affinity key of a daemon's replicas


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


def parse_completion(body: Any, model: str, vocab_size: int | None = None) -> GenerationRequest:
    """A /v1/completions body → a request (400/404 APIError when it is not acceptable).

    `vocab_size`: prompt and stop token ids must be below it (any int64 when None).
    """
    body = _object(body)
    prompt = _prompt(body.get("prompt"), vocab_size)
    max_tokens = body.get("max_tokens")
    params = _sampling(body, 16 if max_tokens is None else max_tokens, "max_tokens", vocab_size)
    return GenerationRequest(
        model=_model(body, model), params=params, prompt=prompt, user=_user(body), **_stream(body)
    )


def parse_chat(body: Any, model: str, vocab_size: int | None = None) -> GenerationRequest:
    """A /v1/chat/completions body → a request (the messages are checked when rendered)."""
    body = _object(body)
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise bad_request("response_format other than text is not supported", "response_format")
    if body.get("max_completion_tokens") is not None:
        max_tokens, name = body["max_completion_tokens"], "max_completion_tokens"
    else:
        max_tokens, name = body.get("max_tokens"), "max_tokens"
    fill = max_tokens is None
    if fill:
        # "as many as fit" is known only once the prompt is (`fill_max_tokens`); until
        # then a stand-in that any valid min_tokens fits under
        floor = body.get("min_tokens")
        max_tokens = floor if _is_int(floor) and 1 <= floor <= INT64_MAX else 1
    params = _sampling(body, max_tokens, name, vocab_size)
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise bad_request("messages must be a non-empty list of {role, content}", "messages")
    return GenerationRequest(
        model=_model(body, model),
        params=params,
        messages=body["messages"],
        fill_max_tokens=fill,
        user=_user(body),
        **_stream(body),
    )


def _user(body: dict[str, Any]) -> str | None:
    """OpenAI's `user`: a string of at most 256 characters, or absent."""
    user = body.get("user")
    if user is None:
        return None
    if not isinstance(user, str) or not 0 < len(user) <= 256:
        raise bad_request("user must be a string of 1 to 256 characters", "user")
    return user


def fill_max_tokens(params: SamplingParams, room: int) -> SamplingParams:
    """`params` with max_tokens = the `room` left after the prompt (chat without max_tokens).

    With no room left the job asks for 1 token, and the daemon refuses the prompt as
    too long, as it would with any max_tokens.
    """
    room = max(1, room)
    if params.min_tokens > room:
        raise bad_request(
            f"min_tokens={params.min_tokens} is more than the {room} tokens that fit after "
            "the prompt",
            "min_tokens",
        )
    try:
        return dataclasses.replace(params, max_tokens=room)
    except ConfigError as exc:
        raise bad_request(str(exc)) from None


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _model(body: dict[str, Any], served: str) -> str:
    name = body.get("model")
    if name is None:
        return served
    if not isinstance(name, str):
        raise bad_request(f"model must be a string, got {show(name)}", "model")
    if name != served:
        raise APIError(
            404,
            f"The model `{clip(name, 100)}` does not exist; this server serves `{served}`.",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    return served


def _prompt(prompt: Any, vocab_size: int | None) -> str | list[int]:
    # OpenAI takes a batch (a list of prompts); fsd takes one prompt per request
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return list(_token_ids(prompt, "prompt", vocab_size))
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request(
            "fsd takes one prompt per request; send a batch as separate requests", "prompt"
        )
    raise bad_request("prompt must be a string or a non-empty list of token ids", "prompt")


def _token_ids(ids: list[Any], name: str, vocab_size: int | None) -> tuple[int, ...]:
    """Integer token ids, each in [0, vocab_size) (a 400 naming `name` otherwise)."""
    top = INT64_MAX if vocab_size is None else vocab_size - 1
    for t in ids:
        if not _is_int(t) or not 0 <= t <= top:
            raise bad_request(
                f"{name} token ids must be integers in [0, {top}], got {show(t)}", name
            )
    return tuple(ids)


def _stream(body: dict[str, Any]) -> dict[str, bool]:
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request(f"stream must be a boolean, got {show(stream)}", "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    usage = (options or {}).get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise bad_request("stream_options.include_usage must be a boolean", "stream_options")
    return {"stream": stream, "include_usage": bool(usage)}


def _sampling(
    body: dict[str, Any], max_tokens: Any, max_name: str, vocab_size: int | None
) -> SamplingParams:
    for name, fine in _UNSUPPORTED.items():
        value = body.get(name)
        if not any(type(value) is type(f) and value == f for f in fine):  # True is not 1
            raise bad_request(
                f"{name}={show(value)} is not supported by fsd", name, "unsupported_parameter"
            )
    kw: dict[str, Any] = {"max_tokens": _int(max_tokens, max_name, 1)}
    for name, lo, hi in (("temperature", 0.0, MAX_TEMPERATURE), ("top_p", 0.0, 1.0)):
        if body.get(name) is not None:
            kw[name] = _number(body[name], name, lo, hi)
    if body.get("seed") is not None:
        kw["seed"] = _int(body["seed"], "seed", 0, MAX_SEED)  # the SDK's and the wire's range
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
        if not isinstance(ids, list):
            raise bad_request("stop_token_ids must be a list of integers", "stop_token_ids")
        kw["stop_token_ids"] = _token_ids(ids, "stop_token_ids", vocab_size)
    if kw.get("min_tokens", 0) > kw["max_tokens"]:
        raise bad_request(
            f"min_tokens={kw['min_tokens']} must not exceed {max_name}={kw['max_tokens']}",
            "min_tokens",
        )
    try:
        return SamplingParams(**kw)
    except ConfigError as exc:  # fsd's own checks (SamplingParams) name the field first
        field = str(exc).split(" ", 1)[0]
        raise bad_request(str(exc), field if field in kw else None) from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: Any, name: str, lo: int, hi: int = INT64_MAX) -> int:
    if not _is_int(value) or not lo <= value <= hi:
        raise bad_request(f"{name} must be an integer in [{lo}, {hi}], got {show(value)}", name)
    return int(value)


def _number(value: Any, name: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise bad_request(f"{name} must be a number in [{lo:g}, {hi:g}], got {show(value)}", name)
    return float(value)
