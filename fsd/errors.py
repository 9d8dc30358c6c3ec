"""Errors that fsd raises on bad input: each names the problem in plain words.

Every class carries its one wire code (`code`): the daemon answers a refused
request with `Error(code=exc.code)`, so a client can route on the code alone.
"""

from __future__ import annotations

from typing import ClassVar


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
    """The daemon holds as many jobs as its limits allow."""

    code: ClassVar[str] = "overloaded"
