"""Synthetic prompts: random token ids of an exact length.

Bursts, injected scenarios and `fsctl play` all make their jobs' prompts here, so a
job of a given prompt length is built the same way wherever it is played.
"""

from __future__ import annotations

import numpy as np


def random_prompt(rng: np.random.Generator, length: int, vocab: int) -> list[int]:
    """`length` token ids drawn uniformly from [1, vocab) (0 is often a special token)."""
    return rng.integers(1, vocab, length).tolist()
