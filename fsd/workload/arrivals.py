"""Arrival processes: when requests reach the server.

A renewal process is described by its mean rate (requests per second) and the
coefficient of variation (CV = std / mean) of its inter-arrival times. Poisson is the
CV 1 case (exponential gaps). The Gamma process (used by the FastServe paper's first
version and by AlpaServe) keeps the rate and varies the burstiness: gaps are
Gamma(shape k = 1 / CV^2, scale = 1 / (rate * k)), so mean 1 / rate and CV exactly
as asked; CV > 1 gives bursts of arrivals separated by long quiet spells.

Every sampler takes a numpy `Generator`, so a workload is a pure function of its seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fsd.errors import ConfigError

ARRIVALS = ("poisson", "gamma", "uniform")


@dataclass(frozen=True)
class ArrivalProcess:
    """A renewal process: i.i.d. inter-arrival gaps with a given mean rate and CV.

    kind "poisson" (CV 1), "gamma" (any CV > 0) or "uniform" (evenly spaced, CV 0).
    """

    kind: str = "poisson"
    rate: float = 1.0  # requests per second
    cv: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ARRIVALS:
            raise ConfigError(f"arrival must be one of {', '.join(ARRIVALS)}; got {self.kind!r}")
        if not np.isfinite(self.rate) or self.rate <= 0:
            raise ConfigError(f"rate must be > 0 requests/s, got {self.rate}")
        if not np.isfinite(self.cv) or self.cv < 0:
            raise ConfigError(f"cv must be >= 0, got {self.cv}")
        if self.kind == "poisson" and self.cv != 1.0:
            raise ConfigError(f"a poisson process has cv 1; use arrival 'gamma' for cv {self.cv}")
        if self.kind == "gamma" and self.cv == 0:
            raise ConfigError("a gamma process needs cv > 0; use arrival 'uniform' for cv 0")
        if self.kind == "uniform" and self.cv != 0.0:
            object.__setattr__(self, "cv", 0.0)

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` inter-arrival times in seconds."""
        if n < 0:
            raise ConfigError(f"number of requests must be >= 0, got {n}")
        mean = 1.0 / self.rate
        if self.kind == "uniform":
            return np.full(n, mean)
        if self.kind == "poisson":
            return rng.exponential(mean, n)
        shape = 1.0 / (self.cv * self.cv)
        return rng.gamma(shape, mean / shape, n)

    def times(self, n: int, rng: np.random.Generator, start: float = 0.0) -> np.ndarray:
        """Arrival times of `n` requests; the first arrives at `start` (no idle lead-in)."""
        g = self.gaps(n, rng)
        if n:
            g[0] = 0.0
        return start + np.cumsum(g)

    def with_rate(self, rate: float) -> ArrivalProcess:
        """The same process at another rate (sweeps keep the seed and the CV)."""
        return ArrivalProcess(self.kind, rate, self.cv)

    def describe(self) -> str:
        if self.kind == "gamma":
            return f"gamma(rate={self.rate:g}/s, cv={self.cv:g})"
        return f"{self.kind}(rate={self.rate:g}/s)"


def poisson(rate: float) -> ArrivalProcess:
    return ArrivalProcess("poisson", rate, 1.0)


def gamma(rate: float, cv: float) -> ArrivalProcess:
    return ArrivalProcess("gamma", rate, cv)


def make_arrivals(kind: str, rate: float, cv: float | None = None) -> ArrivalProcess:
    """Build a process from CLI-style arguments (cv defaults to the kind's natural value)."""
    if kind == "poisson":
        if cv is not None and cv != 1.0:
            raise ConfigError(f"a poisson process has cv 1; use --arrival gamma for cv {cv}")
        return poisson(rate)
    if kind == "uniform":
        return ArrivalProcess("uniform", rate, 0.0)
    if kind == "gamma":
        return gamma(rate, 1.0 if cv is None else cv)
    raise ConfigError(f"arrival must be one of {', '.join(ARRIVALS)}; got {kind!r}")


def empirical_rate_cv(times: np.ndarray) -> tuple[float, float]:
    """Mean rate and inter-arrival CV of a sorted sequence of arrival times."""
    gaps = np.diff(np.asarray(times, dtype=float))
    if gaps.size < 2 or gaps.mean() <= 0:
        return float("nan"), float("nan")
    return float(1.0 / gaps.mean()), float(gaps.std() / gaps.mean())
