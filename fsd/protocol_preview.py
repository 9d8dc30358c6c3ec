"""The what-if messages: `Preview` asks the live twin, `PreviewReply` answers.

A preview runs the daemon's simulator forward from a snapshot of the live state,
once under the current settings and once under `changes` (the keys and values
`Retune` takes), for `horizon` seconds and `seeds` draws of the arrivals; nothing
is applied. The answer comes when the runs end (seconds), named by the request's
`req_id` like an injected scenario's; a second preview while one runs is refused
(`Error` code "overloaded").

Every figure is a `Spread` over the seeds: the mean and the lowest and highest run.
Latencies are over the jobs that finish inside the horizon (what an operator would
measure over the same minute); `ttft_p99` also counts, at the horizon, the jobs still
waiting for their first token (a policy that starves them is not rewarded).

Added within protocol version 2 (a message type older peers do not know: an older
daemon answers `Error` "unknown-type"); `v` is checked as for every message.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fsd.wire import PROTOCOL_VERSION

DEFAULT_HORIZON = 60.0  # seconds a preview looks ahead
MAX_HORIZON = 600.0
DEFAULT_SEEDS = 4
MAX_SEEDS = 16


class Preview(msgspec.Struct, tag="preview", tag_field="type", kw_only=True, omit_defaults=True):
    """What would `changes` do over the next `horizon` seconds? (operator role)."""

    v: int = PROTOCOL_VERSION
    token: str | None = None
    session: str | None = None  # the connection's session secret (fsd.protocol)
    changes: dict[str, Any]
    horizon: float = DEFAULT_HORIZON
    seeds: int = DEFAULT_SEEDS
    req_id: str | None = None


class Spread(msgspec.Struct, kw_only=True):
    """One figure across the seeds' runs (NaN when no run measured it)."""

    mean: float
    lo: float
    hi: float


class PreviewSide(msgspec.Struct, kw_only=True):
    """The horizon under one set of settings."""

    avg: Spread  # mean per-token latency (end-to-end / output tokens), seconds
    p95: Spread  # its 95th percentile
    ttft_p99: Spread  # seconds
    goodput: Spread  # finished jobs within the SLO per second of horizon
    finished: Spread  # jobs finished inside the horizon
    unfinished: Spread  # jobs still in the system at its end
    preemptions: Spread
    swaps: Spread  # swap-outs + swap-ins started inside the horizon
    peak_kv_blocks: Spread  # device blocks in use at the peak


class PreviewAssumptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the twin took as given: a preview is only as good as these."""

    taken_at: float  # the snapshot's wall-clock time: the horizon runs from here
    horizon: float
    seeds: list[int]
    live_jobs: int  # jobs in the daemon at the snapshot
    sampled_remaining: int  # of them, those whose output length was drawn (not known)
    arrival_rate: float  # fitted, requests per second (0: none assumed)
    arrival_cv: float  # inter-arrival coefficient of variation (1: Poisson)
    arrival_window: float  # seconds of recent arrivals the fit read
    arrivals_seen: int
    lengths_from: int  # finished jobs whose (prompt, output) lengths are resampled
    clock_scale: float  # an iteration takes clock_scale x the profile's time ...
    clock_overhead: float  # ... + this many seconds (fitted on recent iterations)
    clock_samples: int
    slo: float  # per-token seconds a job must meet to count in goodput
    notes: list[str] = []


class PreviewReply(
    msgspec.Struct, tag="preview_reply", tag_field="type", kw_only=True, omit_defaults=True
):
    """The preview's answer: current vs proposed over the same horizon and seeds."""

    v: int = PROTOCOL_VERSION
    changes: dict[str, Any]
    current: PreviewSide
    proposed: PreviewSide
    assumptions: PreviewAssumptions
    wall_s: float = 0.0  # how long the twin ran
    req_id: str | None = None
