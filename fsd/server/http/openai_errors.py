"""OpenAI-format errors: APIError, 400s, and the HTTP form of fsd's refusal codes."""

from __future__ import annotations

import math
from typing import Any


class APIError(Exception):
    """An error answered in OpenAI's format: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        # an overload refusal's hint, sent as the Retry-After header (whole seconds)
        self.headers = {} if retry_after is None else {"Retry-After": f"{math.ceil(retry_after)}"}

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
    """A 400 in OpenAI's format, naming the parameter at fault when there is one."""
    return APIError(400, message, "invalid_request_error", param, code)


def clip(text: str, limit: int = 40) -> str:
    """`text`, cut so that an error never echoes a large body back."""
    return text if len(text) <= limit else text[:limit] + "..."


def show(value: Any) -> str:
    """A short, safe rendering of a client's value for an error message."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return clip(repr(value))


# fsd's stable error codes (protocol Error.code) → HTTP status, OpenAI type and code.
# A code not listed is the daemon's own failure ("internal", a worker's): 500.
_FSD_CODES: dict[str, tuple[int, str, str | None]] = {
    "invalid": (400, "invalid_request_error", None),
    "invalid-setting": (400, "invalid_request_error", None),
    "malformed": (400, "invalid_request_error", None),
    "unknown-type": (400, "invalid_request_error", None),
    "prompt-too-long": (400, "invalid_request_error", "context_length_exceeded"),
    "too-large": (413, "invalid_request_error", "request_too_large"),
    "refused": (400, "invalid_request_error", None),
    "unknown-job": (404, "invalid_request_error", None),
    "forbidden": (403, "permission_error", None),
    # OpenAI answers "the engine is currently overloaded" with 429: clients retry later
    "overloaded": (429, "rate_limit_error", "engine_overloaded"),
    "draining": (503, "service_unavailable", "draining"),
}


def from_fsd_error(code: str, message: str, retry_after: float | None = None) -> APIError:
    """The HTTP form of a daemon refusal (`fsd.client.RequestError`)."""
    status, kind, oa_code = _FSD_CODES.get(code, (500, "internal_error", None))
    return APIError(status, message, kind, None, oa_code or code, retry_after)


def job_failed(message: str | None) -> APIError:
    """A job the engine ended with reason "error": the server's failure, a 500."""
    text = message or "the engine failed while generating this job"
    return APIError(500, text, "internal_error", None, "engine_error")
