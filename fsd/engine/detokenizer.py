"""Incremental detokenization of a job's output, with its stop strings.

Text that could still turn out to be the start of a stop string is held back, so
a client never sees a stop string it then has to take back. Every piece of text,
including what the detokenizer releases only at the end, passes the same check.
"""

from __future__ import annotations

from collections.abc import Sequence

from fsd.tokenizer import IncrementalDetokenizer, Tokenizer


class JobDetokenizer:
    """An incremental detokenizer for one job: text deltas as tokens come, stop strings found."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stops: Sequence[str]):
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stops = tuple(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self.text = ""
        self._emitted = 0
        self.stop: str | None = None  # the stop string found, if any

    def add(self, token_id: int) -> str:
        """Take one token; return the text now safe to emit (check `stop` afterwards)."""
        if not self._stops:  # nothing to find or hold back: the text as it comes
            chunk = self._detok.add(token_id)
            self.text += chunk
            self._emitted = len(self.text)
            return chunk
        if self.stop is None:
            self._absorb(self._detok.add(token_id))
        if self.stop is not None:
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self._hold)

    def finish(self) -> str:
        """The job has ended: release the rest (never past a stop string)."""
        if self.stop is None:
            self._absorb(self._detok.flush())
        return self._emit(len(self.text))

    def _absorb(self, chunk: str) -> None:
        if not chunk:
            return
        start = max(0, len(self.text) - self._hold)
        self.text += chunk
        hits = [(i, s) for s in self._stops if (i := self.text.find(s, start)) >= 0]
        if hits:
            cut, self.stop = min(hits)
            self.text = self.text[:cut]

    def _emit(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        delta = self.text[self._emitted : upto]
        self._emitted = upto
        return delta
