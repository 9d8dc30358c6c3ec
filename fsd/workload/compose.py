"""Workloads built from parts: several services' streams merged into one (a
multi-tenant API), a rate that changes by phase (a transient overload), and the
outputs of a reasoning model: bimodal, or long and heavy-tailed.

Each is seeded and a pure function of its arguments, like `synthetic`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fsd.errors import ConfigError
from fsd.workload.arrivals import ArrivalProcess
from fsd.workload.length_models import LengthModel, Lengths, Lognormal, Mixture
from fsd.workload.spec import Workload, synthetic

# A reasoning model's service: long prompts; half the requests a short answer, half a
# long chain of thought (median 3,000 tokens, a tail to tens of thousands).
_PROMPT = Lognormal.from_median(1500, 0.8, high=32768)
REASONING = Mixture(
    LengthModel("answer", _PROMPT, Lognormal.from_median(200, 0.7, high=4096), None),
    LengthModel("think", _PROMPT, Lognormal.from_median(3000, 0.9, high=32768), None),
    0.5,
    name="reasoning",
)

# A reasoning service whose every answer thinks at length: outputs not bimodal but
# one heavy-tailed body (median 2,500 tokens, a tail to the cap), so no short class
# exists for a scheduler to favour.
LONG_REASONING = LengthModel(
    "long-reasoning", _PROMPT, Lognormal.from_median(2500, 1.0, high=32768), None
)


def merge(parts: Sequence[Workload], source: str) -> Workload:
    """The requests of every part on one clock (each part's arrivals kept)."""
    if not parts:
        raise ConfigError("merge needs at least one workload")
    if any(p.prefix_hashes for p in parts):
        raise ConfigError("merge does not combine prefix hashes; merge workloads without them")
    arrivals = np.concatenate([[r.arrival for r in p.requests] for p in parts])
    prompts = np.concatenate([[r.prompt_len for r in p.requests] for p in parts])
    outputs = np.concatenate([[r.output_len for r in p.requests] for p in parts])
    params = {"parts": [p.source for p in parts]}
    return Workload.from_arrays(arrivals, prompts, outputs, source, params)


def tenants(
    mix: Sequence[tuple[Lengths, float, float]], rate: float, num_requests: int, seed: int
) -> Workload:
    """A multi-tenant service: `mix` is (lengths, share of the rate, arrival CV) per
    tenant; each tenant's requests arrive by its own Gamma process (CV 1: Poisson)."""
    total = sum(share for _, share, _ in mix)
    if not mix or total <= 0 or any(share <= 0 for _, share, _ in mix):
        raise ConfigError("tenants need positive shares of the rate")
    parts = []
    for k, (lengths, share, cv) in enumerate(mix):
        kind = "poisson" if cv == 1.0 else "gamma"
        arrivals = ArrivalProcess(kind, rate * share / total, cv)
        n = max(1, round(num_requests * share / total))
        parts.append(synthetic(arrivals, lengths, n, seed * 101 + k))
    names = "+".join(f"{lengths.name}(cv {cv:g})" for lengths, _, cv in mix)
    return merge(parts, f"tenants {names} at {rate:g}/s")


def phased(
    phases: Sequence[tuple[float, float]], lengths: Lengths, seed: int, cv: float = 1.0
) -> Workload:
    """Arrivals whose rate changes by phase: `phases` is (duration s, rate /s) in
    order; within a phase a renewal process of that rate and `cv`."""
    if not phases or any(d <= 0 or r <= 0 for d, r in phases):
        raise ConfigError("phases need positive durations and rates")
    rng = np.random.default_rng(seed)
    times: list[np.ndarray] = []
    start = 0.0
    for duration, rate in phases:
        process = ArrivalProcess("poisson" if cv == 1.0 else "gamma", rate, cv)
        # enough gaps to pass the phase's end, drawn in one go
        n = int(rate * duration * 1.5) + 16
        t = start + np.cumsum(process.gaps(n, rng))
        times.append(t[t < start + duration])
        start += duration
    arrivals = np.concatenate(times)
    if not len(arrivals):
        raise ConfigError("the phases produce no arrivals")
    prompts, outputs = lengths.sample(len(arrivals), rng)
    desc = ", ".join(f"{r:g}/s for {d:g} s" for d, r in phases)
    return Workload.from_arrays(
        arrivals, prompts, outputs, f"phased({desc}) x {lengths.name}", {"seed": seed}
    )
