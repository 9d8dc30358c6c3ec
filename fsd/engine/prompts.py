"""A request's token ids, checked against the model: the engine's input rule.

May import fsd.errors and fsd.jobs only (no torch): the tokenizer is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsd.errors import ConfigError
from fsd.jobs import SamplingParams


def check_stop_ids(params: SamplingParams, vocab: int) -> None:
    """An id past the logits would fail the job's every sampling step: refuse it now."""
    bad = [t for t in params.stop_token_ids if t >= vocab]
    if bad:
        raise ConfigError(
            f"stop_token_ids must be below the model's vocabulary size {vocab}, got {bad[:5]}"
        )


def prompt_ids(prompt: str | Sequence[int], tokenizer: Any, vocab: int) -> list[int]:
    """The prompt's token ids: encoded text, or ids each an int in [0, vocab)."""
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"token ids must be ints in [0, {vocab}); got {bad[:5]}")
    if not ids:
        raise ConfigError("the prompt is empty")
    return ids
