"""Errors that fsd raises on bad input: each names the problem in plain words.

Every class carries its one wire code (`code`): the daemon answers a refused
request with `Error(code=exc.code)`, so a client can route on the code alone.
`read_parsed` turns a missing or unreadable settings file into one such error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar


class FsdError(Exception):
    """Base of every error fsd raises deliberately (never a deep torch traceback)."""

    code: ClassVar[str] = "refused"


class ConfigError(FsdError, ValueError):
    """An invalid setting or request field: names the field and the value."""

    code: ClassVar[str] = "invalid"


class SettingError(ConfigError):
    """A live retune the engine refuses (an unknown or invalid setting); changes nothing."""

    code: ClassVar[str] = "invalid-setting"


class ModelLoadError(FsdError):
    """An unknown preset or a missing / malformed checkpoint directory."""

    code: ClassVar[str] = "model-load"


class PromptTooLongError(FsdError, ValueError):
    """A prompt that cannot fit the model's context together with its output."""

    code: ClassVar[str] = "prompt-too-long"


class UnknownJobError(FsdError, KeyError):
    """A job id that the engine does not hold."""

    code: ClassVar[str] = "unknown-job"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ForbiddenError(FsdError, PermissionError):
    """A request that needs a role its sender does not have."""

    code: ClassVar[str] = "forbidden"


class OverloadedError(FsdError):
    """The daemon holds as many jobs as its limits allow, or is too far behind to take
    one more; `retry_after`: seconds after which a retry may be taken (None: no hint)."""

    code: ClassVar[str] = "overloaded"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def read_parsed(path: Path, what: str, fmt: str, parse: Callable[[str], Any], invalid: type) -> Any:
    """The file at `path` parsed by `parse`, or a ConfigError naming it (`what`, e.g.
    "config file"): it does not exist, or is not valid `fmt` (`parse` raised `invalid`)."""
    try:
        return parse(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} {str(path)!r} does not exist") from None
    except invalid as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid {fmt}: {exc}") from None
