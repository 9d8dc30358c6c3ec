"""OpenAI response bodies and stream chunks built from fsd's results."""

from __future__ import annotations

import time
import uuid
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; `cached_tokens`: prompt tokens reused from the prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _envelope(
    rid: str,
    obj: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    use: dict[str, Any] | None = None,
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
    rid: str, created: int, model: str, text: str, reason: str | None, use: dict[str, Any]
) -> dict[str, Any]:
    return _envelope(rid, "text_completion", created, model, [_choice(reason, text=text)], use)


def completion_chunk(
    rid: str, created: int, model: str, text: str, reason: str | None
) -> dict[str, Any]:
    return _envelope(rid, "text_completion", created, model, [_choice(reason, text=text)])


def chat_body(
    rid: str, created: int, model: str, text: str, reason: str | None, use: dict[str, Any]
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
    rid: str, created: int, model: str, obj: str, use: dict[str, Any]
) -> dict[str, Any]:
    """The last chunk of a stream with stream_options.include_usage: no choices."""
    return _envelope(rid, obj, created, model, [], use)
