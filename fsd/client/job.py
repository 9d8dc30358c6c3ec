"""A job as its handle sees it: `JobState`, fed the items of the job's stream.

`ClientCore` routes a job's `Accepted`, chunks, `Finished` or `Error` (or the
client's own error: daemon gone, client closed) to its stream queue; the handle
(`AsyncJobHandle`, and through it the sync `JobHandle`) feeds them here and asks
for what it needs: the job id, the next chunk, the whole result. `JobView` is what
both handles tell of their job without waiting.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from fsd import protocol as P
from fsd.client.base import Completion
from fsd.client.errors import RequestError


class JobState:
    """What a handle knows about its job; fed the items its stream queue receives."""

    def __init__(self, req_id: str) -> None:
        self.req_id = req_id
        self.job_id: str | None = None
        self.prompt_tokens: int | None = None
        self.pending: deque[P.Chunk] = deque()
        self.result: Completion | None = None
        self.error: BaseException | None = None
        self._tokens = 0
        self._text: list[str] = []

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    @property
    def answered(self) -> bool:
        """Accepted or ended: `accepted_id` has its answer."""
        return self.job_id is not None or self.done

    @property
    def ready(self) -> bool:
        """A chunk to hand out, or the end: `take` has its answer."""
        return bool(self.pending) or self.done

    def accepted_id(self) -> str:
        """The daemon's id for the job, or its refusal raised (once `answered`)."""
        if self.job_id is None:
            raise self.error  # type: ignore[misc]
        return self.job_id

    def take(self) -> P.Chunk | None:
        """The next chunk; None once the stream ended, or its error raised (once `ready`)."""
        if self.pending:
            return self.pending.popleft()
        if self.error is not None:
            raise self.error
        return None

    def outcome(self) -> Completion:
        """The finished job, or its error raised (once `done`); drops the chunks not
        taken."""
        self.pending.clear()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def feed(self, item: Any) -> None:
        if isinstance(item, P.Accepted):
            self.job_id, self.prompt_tokens = item.job_id, item.prompt_tokens
        elif isinstance(item, P.Chunk):
            self.job_id = self.job_id or item.job_id
            self._tokens += len(item.token_ids)
            self._text.append(item.text)
            self.pending.append(item)
        elif isinstance(item, P.Finished):
            self.job_id = self.job_id or item.job_id
            self._tail(item)
            self.result = Completion.of(item, self.prompt_tokens)
        elif isinstance(item, P.Error):
            self.error = RequestError.of(item)
        elif isinstance(item, BaseException):
            self.error = item

    def _tail(self, fin: P.Finished) -> None:
        # Tokens that reached only the Finished message still reach the stream.
        if len(fin.token_ids) <= self._tokens:
            return
        streamed = "".join(self._text)
        rest = fin.text[len(streamed) :] if fin.text.startswith(streamed) else ""
        self.pending.append(
            P.Chunk(
                req_id=fin.req_id,
                job_id=fin.job_id,
                token_ids=list(fin.token_ids[self._tokens :]),
                text=rest,
            )
        )
        self._tokens = len(fin.token_ids)


class JobView:
    """What a job's handle tells without waiting (its `_state` is the job's)."""

    _state: JobState

    @property
    def req_id(self) -> str:
        return self._state.req_id

    @property
    def prompt_tokens(self) -> int | None:
        return self._state.prompt_tokens

    @property
    def done(self) -> bool:
        return self._state.done

    @property
    def finished(self) -> bool:
        """The job's end arrived (not an error of the client's: the job is over)."""
        return self._state.result is not None
