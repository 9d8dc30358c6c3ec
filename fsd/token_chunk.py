"""One job's new tokens as the wire carries them: the engine makes each `Chunk` once,
the daemon's router only addresses it (its owner's `req_id`, the stream's `start`),
and a client reads it (`fsd.protocol` re-exports it with the other messages)."""

from __future__ import annotations

import msgspec


class Chunk(msgspec.Struct, kw_only=True, omit_defaults=True):
    """New tokens of one job; `start` is how many output tokens came before them (a
    client that sees a gap stops streaming that job and takes the rest from its
    `Finished`, which carries every token)."""

    req_id: str = ""  # the owner's name for the job, set by the router that sends it
    job_id: str
    token_ids: list[int]
    text: str = ""
    start: int | None = None
