"""Strict decoding of OpenAI request bodies: JSON the daemon's wire format can carry.

Bodies are decoded strictly (`decode_body`): UTF-8 JSON without NaN or Infinity,
every number one the daemon's wire format can carry (integers in [-2**63, 2**64-1],
finite floats), strings that are valid Unicode, nesting at most `MAX_DEPTH` deep.
Whatever a body holds, a bad one is a 400 here and never reaches the engine.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fsd.server.http.openai_errors import bad_request, clip

# the integers msgpack (the daemon's wire format) can carry: a bigger one could not
# travel to the engine, so it is refused where it is read
WIRE_INT_MIN, WIRE_INT_MAX = -(2**63), 2**64 - 1
MAX_DEPTH = 32  # OpenAI bodies nest 4 deep (messages[].content[].text); 32 is plenty


class _BadNumber(ValueError):
    """A JSON number fsd cannot hold (raised from inside json.loads)."""


def _json_int(text: str) -> int:
    # checked on the digits first: Python refuses to convert over 4300 of them anyway
    if len(text.lstrip("-")) > 20:
        raise _BadNumber(f"integer {clip(text)} is out of range")
    value = int(text)
    if not WIRE_INT_MIN <= value <= WIRE_INT_MAX:
        raise _BadNumber(f"integer {text} is out of range")
    return value


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber(f"number {clip(text)} is out of range")
    return value


def _json_constant(text: str) -> Any:
    raise _BadNumber(f"{text} is not a JSON value")


def decode_body(raw: bytes) -> Any:
    """A request body as JSON, or a 400 saying what is wrong with it (see the module doc)."""
    try:
        text = raw.decode("utf-8-sig")  # JSON is UTF-8 (RFC 8259), whatever charset claims
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"the request body is not valid UTF-8 (byte {exc.start})", code="invalid_json"
        ) from None
    try:
        body = json.loads(
            text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant
        )
    except _BadNumber as exc:
        raise bad_request(
            f"the request body holds a number fsd cannot take: {exc} (integers must be in "
            f"[-2**63, 2**64-1], numbers finite)",
            code="invalid_json",
        ) from None
    except RecursionError:
        raise bad_request(
            f"the request body nests more than {MAX_DEPTH} levels deep", code="invalid_json"
        ) from None
    except ValueError as exc:  # JSONDecodeError
        raise bad_request(
            f"the request body is not valid JSON: {clip(str(exc), 200)}", code="invalid_json"
        ) from None
    _check_tree(body)
    return body


def _check_tree(body: Any) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings that are not valid Unicode.

    A lone surrogate (`"\\ud800"` is valid JSON) cannot be encoded as UTF-8, so it
    would fail later in the tokenizer or the wire encoder; here it is a clear 400.
    Iterative: a deep body cannot exhaust the stack.
    """
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise bad_request(
                    f"the request body nests more than {MAX_DEPTH} levels deep",
                    code="invalid_json",
                )
            if isinstance(value, dict):
                for key in value:
                    _check_text(key)
                items = value.values()
            else:
                items = value
            stack.extend((item, depth + 1) for item in items if isinstance(item, str | dict | list))


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(
            f"a string in the request body is not valid Unicode: a lone surrogate "
            f"(\\u{ord(text[exc.start]):04x}) at character {exc.start}",
            code="invalid_json",
        ) from None
