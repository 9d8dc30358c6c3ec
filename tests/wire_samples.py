"""Hand-made wire values the console and server tests share (fsd.protocol structs)."""

from __future__ import annotations

from typing import Any

import msgspec

from fsd import protocol as P

# a prefix cache that answered 1000 queries: 600 hits, 200 of them from host memory
PREFIX = P.PrefixInfo(
    enabled=True,
    queries=1000,
    hits=600,
    host_hits=200,
    device_blocks=12,
    host_blocks=3,
    device_evictions=5,
    host_evictions=1,
)

_ROW = P.JobInfo(
    job_id="j", state="running", level=1, kv="device", blocks=2, host_blocks=0, enst=None,
    prompt_tokens=40, output_tokens=3, waited=0.0, attained=0.1, arrival=1.0,
)  # fmt: skip


def job_row(**changes: Any) -> P.JobInfo:
    """A job table row: running at Q1 on the device, 40 prompt and 3 output tokens."""
    return msgspec.structs.replace(_ROW, **changes)
