"""A workload: the requests one experiment replays, each (arrival, prompt_len, output_len).

Built either from a trace (`fsd.workload.trace.read_trace`) or from an arrival process
and a length model with a seed (`synthetic`). Transformations return new workloads
(time scaling, clipping to a context, slicing), so one trace feeds a whole sweep.
Arrival times are seconds from the first request.

Prefix hashes: a trace that records the prompt's prefix blocks (Mooncake's `hash_ids`,
equal ids = a reusable prefix) keeps them in `Workload.prefix_hashes`, one tuple per
request in request order (empty: none recorded). They live beside `requests`, not in
`Request`, so a `Request` stays the 3-tuple every caller compares and unpacks. A
clipped request loses its hashes: clipping trims the prompt's oldest tokens, so its
blocks no longer describe it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from fsd.errors import ConfigError
from fsd.metrics import percentile
from fsd.workload.arrivals import ArrivalProcess, empirical_rate_cv
from fsd.workload.length_models import Lengths, clip_lengths


class Request(NamedTuple):
    """One request: when it arrives (s), its prompt tokens and the tokens it will generate."""

    arrival: float
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class Workload:
    """An ordered list of requests plus where it came from (and, from some traces, each
    request's prefix block hashes)."""

    requests: tuple[Request, ...]
    source: str = "workload"
    params: dict[str, object] = field(default_factory=dict, compare=False)
    prefix_hashes: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        reqs = tuple(self.requests)
        hashes = tuple(tuple(h) for h in self.prefix_hashes)
        if hashes and len(hashes) != len(reqs):
            raise ConfigError(
                f"{self.source}: {len(hashes)} prefix hash lists for {len(reqs)} requests"
            )
        object.__setattr__(self, "prefix_hashes", hashes)
        for i, r in enumerate(reqs):
            if r.prompt_len < 1 or r.output_len < 1:
                raise ConfigError(
                    f"{self.source}: request {i} needs prompt_len >= 1 and output_len >= 1, "
                    f"got {r.prompt_len} and {r.output_len}"
                )
            if not np.isfinite(r.arrival) or (i and r.arrival < reqs[i - 1].arrival):
                raise ConfigError(f"{self.source}: request {i} arrives out of order ({r.arrival})")
        object.__setattr__(self, "requests", reqs)

    @classmethod
    def from_arrays(
        cls,
        arrivals: Sequence[float] | np.ndarray,
        prompts: Sequence[int] | np.ndarray,
        outputs: Sequence[int] | np.ndarray,
        source: str = "workload",
        params: dict[str, object] | None = None,
        prefix_hashes: Sequence[tuple[int, ...]] = (),
    ) -> Workload:
        """Requests sorted by arrival (stable); `prefix_hashes`, if any, follow them."""
        a = np.asarray(arrivals, dtype=float)
        p = np.asarray(prompts, dtype=np.int64)
        o = np.asarray(outputs, dtype=np.int64)
        if not len(a) == len(p) == len(o):
            raise ConfigError(f"{source}: arrivals, prompts and outputs differ in length")
        if len(prefix_hashes) and len(prefix_hashes) != len(a):
            raise ConfigError(f"{source}: prefix hashes and requests differ in length")
        order = np.argsort(a, kind="stable")
        reqs = tuple(Request(float(a[i]), int(p[i]), int(o[i])) for i in order)
        hashes = tuple(prefix_hashes[i] for i in order) if len(prefix_hashes) else ()
        return cls(reqs, source, dict(params or {}), hashes)

    # ---- views -----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    def __getitem__(self, i: int) -> Request:
        return self.requests[i]

    def prefix_of(self, i: int) -> tuple[int, ...]:
        """Request `i`'s prefix block hashes (empty when the workload records none)."""
        return self.prefix_hashes[i] if self.prefix_hashes else ()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.requests:
            return np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)
        a, p, o = zip(*self.requests, strict=True)
        return np.array(a, float), np.array(p, np.int64), np.array(o, np.int64)

    @property
    def duration(self) -> float:
        """Seconds from the first arrival to the last."""
        return self.requests[-1].arrival - self.requests[0].arrival if self.requests else 0.0

    @property
    def rate(self) -> float:
        """Mean arrival rate (requests/s) over the span of arrivals."""
        return (len(self) - 1) / self.duration if self.duration > 0 else float("nan")

    def summary(self) -> dict[str, float | int | str]:
        a, p, o = self.arrays()
        rate, cv = empirical_rate_cv(a)
        out: dict[str, float | int | str] = {"source": self.source, "requests": len(self)}
        if len(self):
            out.update(
                rate=rate,
                cv=cv,
                duration_s=self.duration,
                prompt_mean=float(p.mean()),
                prompt_p99=percentile(p, 99),
                output_mean=float(o.mean()),
                output_p99=percentile(o, 99),
            )
        if "clipped" in self.params:
            out["clipped"] = self.params["clipped"]  # type: ignore[assignment]
        if self.prefix_hashes:
            blocks, reused = _prefix_reuse(self.prefix_hashes)
            out.update(prefix_blocks=blocks, prefix_reuse=reused / blocks if blocks else 0.0)
        return out

    # ---- transformations -------------------------------------------------------

    def scaled(self, time_scale: float) -> Workload:
        """Arrival rate multiplied by `time_scale`: 0.5 = half the rate (gaps doubled)."""
        check_time_scale(time_scale)
        if not self.requests:
            return self
        t0 = self.requests[0].arrival
        reqs = tuple(
            Request((r.arrival - t0) / time_scale, r.prompt_len, r.output_len) for r in self
        )
        params = {**self.params, "time_scale": self.params.get("time_scale", 1.0) * time_scale}  # type: ignore[operator]
        return Workload(reqs, self.source, params, self.prefix_hashes)

    def clip_mask(self, max_context: int | None, max_output: int | None = None) -> np.ndarray:
        """Which requests `clipped(max_context, max_output)` would shorten."""
        _, p, o = self.arrays()
        cp, co = clip_lengths(p, o, max_context, max_output)
        return (cp != p) | (co != o)

    def clipped(self, max_context: int | None, max_output: int | None = None) -> Workload:
        """Every request bounded to `max_context` tokens in all (see `clip_lengths`);
        params["clipped"] counts the requests that were shortened."""
        if max_context is None and max_output is None:
            return self
        a, p, o = self.arrays()
        cut = self.clip_mask(max_context, max_output)
        p, o = clip_lengths(p, o, max_context, max_output)
        params = {**self.params, "max_context": max_context, "max_output": max_output}
        params["clipped"] = int(cut.sum())
        hashes = self.prefix_hashes
        if hashes and cut.any():
            hashes = tuple(() if c else h for c, h in zip(cut, hashes, strict=True))
        return Workload.from_arrays(a, p, o, self.source, params, hashes)

    def head(self, n: int) -> Workload:
        """The first `n` requests."""
        if n < 0:
            raise ConfigError(f"limit must be >= 0, got {n}")
        params = {**self.params, "limit": n}
        return Workload(self.requests[:n], self.source, params, self.prefix_hashes[:n])

    def window(self, start: float, duration: float) -> Workload:
        """Requests arriving in [start, start + duration), shifted to start at 0."""
        keep = [i for i, r in enumerate(self) if start <= r.arrival < start + duration]
        reqs = [self.requests[i] for i in keep]
        if reqs:
            t0 = reqs[0].arrival
            reqs = [r._replace(arrival=r.arrival - t0) for r in reqs]
        hashes = tuple(self.prefix_hashes[i] for i in keep) if self.prefix_hashes else ()
        params = {**self.params, "window": (start, duration)}
        return Workload(tuple(reqs), self.source, params, hashes)


def check_time_scale(time_scale: float) -> None:
    if not np.isfinite(time_scale) or time_scale <= 0:
        raise ConfigError(f"time_scale must be > 0 (1 = the trace's own rate), got {time_scale}")


def _prefix_reuse(hashes: tuple[tuple[int, ...], ...]) -> tuple[int, int]:
    """(prefix blocks in all, blocks some earlier request already had): the reuse an
    unbounded prefix cache would find."""
    seen: set[int] = set()
    total = reused = 0
    for blocks in hashes:
        total += len(blocks)
        reused += sum(1 for b in blocks if b in seen)
        seen.update(blocks)
    return total, reused


def synthetic(
    arrivals: ArrivalProcess, lengths: Lengths, num_requests: int, seed: int = 0
) -> Workload:
    """`num_requests` requests from an arrival process and a length model, seeded."""
    if num_requests < 1:
        raise ConfigError(f"num_requests must be >= 1, got {num_requests}")
    rng = np.random.default_rng(seed)
    times = arrivals.times(num_requests, rng)
    prompts, outputs = lengths.sample(num_requests, rng)
    params = {
        "arrival": arrivals.kind,
        "rate": arrivals.rate,
        "cv": arrivals.cv,
        "lengths": lengths.name,
        "seed": seed,
    }
    source = f"{arrivals.describe()} x {lengths.name}"
    return Workload.from_arrays(times, prompts, outputs, source, params)
