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


_KV = P.KVInfo(
    block_size=16, device_total=100, device_used=40, device_reserved=8, device_free=60,
    host_total=400, host_used=10, bytes_in_flight=0, swapped_out_bytes=0, swapped_in_bytes=0,
)  # fmt: skip

_SLO = P.SLOInfo(
    window=60.0, finished=3, avg_per_token_latency=None, p95_per_token_latency=None,
    avg_ttft=None, p95_ttft=None, tokens_per_s=10.0, requests_per_s=1.0,
    slo_per_token_latency=0.05,
)  # fmt: skip


def kv_info(**changes: Any) -> P.KVInfo:
    """A snapshot's KV pools: 40 of 100 device blocks used (8 reserved), 10 of 400 on
    the host, nothing moving or moved."""
    return msgspec.structs.replace(_KV, **changes)


def slo_info(**changes: Any) -> P.SLOInfo:
    """A snapshot's SLO window: 3 jobs finished in 60 s, no latency figures, 10 tokens/s,
    an SLO of 50 ms per token."""
    return msgspec.structs.replace(_SLO, **changes)
