"""The client's own errors: no daemon answered, or the daemon refused a request."""

from __future__ import annotations

from typing import ClassVar

from fsd import protocol as P
from fsd.errors import FsdError


class DaemonUnavailable(FsdError, TimeoutError):
    """No fsd daemon answered at the endpoint in time (not running, hung or unreachable).

    Raised on the client side only: the daemon never sends this code.
    """

    code: ClassVar[str] = "unavailable"


class RequestError(FsdError):
    """The daemon refused a request with an `Error` reply.

    `code` is the reply's: the wire code of the daemon's error class (an `FsdError`'s
    `code`, a `ProtocolError`'s own, or "internal"), stable across versions.
    """

    def __init__(
        self, code: str, message: str, req_id: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code  # type: ignore[misc]  # the daemon's code for this refusal
        self.message = message
        self.req_id = req_id
        self.retry_after = retry_after  # seconds to wait before retrying (an overload's hint)

    @classmethod
    def of(cls, reply: P.Error) -> RequestError:
        """The error an `Error` reply stands for."""
        return cls(reply.code, reply.message, reply.req_id, reply.retry_after)


def unavailable(endpoint: str, timeout: float, curve: bool = False) -> DaemonUnavailable:
    hint = " (or it refused this client's CURVE key)" if curve else ""
    return DaemonUnavailable(f"no fsd daemon answered at {endpoint} within {timeout:g} s{hint}")
