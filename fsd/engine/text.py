"""A job's output text as it grows: incremental detokenization plus stop strings.

Text that could still turn out to be the start of a stop string is held back, so
a client never sees a stop string it then has to take back.
"""

from __future__ import annotations

from collections.abc import Sequence

from fsd.tokenizer import IncrementalDetokenizer, Tokenizer


class JobText:
    """Detokenizes one job's output and finds its stop strings."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stops: Sequence[str]):
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stops = tuple(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self.text = ""
        self._emitted = 0

    def add(self, token_id: int) -> tuple[str, str | None]:
        """Take one token; return the text now safe to emit and the stop string hit, if any."""
        self.text += self._detok.add(token_id)
        if self._stops:
            start = max(0, self._emitted - self._hold)
            hits = [(i, s) for s in self._stops if (i := self.text.find(s, start)) >= 0]
            if hits:
                cut, stop = min(hits)
                self.text = self.text[:cut]
                return self.flush(), stop
        safe = len(self.text) - self._hold
        if safe <= self._emitted:
            return "", None
        delta = self.text[self._emitted : safe]
        self._emitted = safe
        return delta, None

    def flush(self) -> str:
        """Everything not yet emitted (the job has finished)."""
        delta = self.text[self._emitted :]
        self._emitted = len(self.text)
        return delta
