"""Errors that fsd raises on bad input: each names the problem in plain words."""

from __future__ import annotations


class FsdError(Exception):
    """Base of every error fsd raises deliberately (never a deep torch traceback)."""


class ConfigError(FsdError, ValueError):
    """An invalid setting: names the field and the value."""


class ModelLoadError(FsdError):
    """An unknown preset or a missing / malformed checkpoint directory."""


class PromptTooLongError(FsdError, ValueError):
    """A prompt that cannot fit the model's context together with its output."""


class UnknownJobError(FsdError, KeyError):
    """A job id that the engine does not hold."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ForbiddenError(FsdError, PermissionError):
    """A request that needs a role its sender does not have (code "forbidden")."""


class OverloadedError(FsdError):
    """The daemon holds as many jobs as its limits allow (code "overloaded")."""
