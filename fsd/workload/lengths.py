"""Length models: how many prompt tokens a request brings and how many it generates.

Two families of distributions:

- `Lognormal(mean, sigma)`: heavy-ish right tail, the usual fit of chat data. We
  parameterise by the *mean* (what papers publish) and the log-space sigma:
  mu = ln(mean) - sigma^2 / 2, so the unclipped mean is exactly `mean`.
- `Zipf(theta, max)`: bounded Zipf on 1..max, P(k) ∝ k^-theta, as in the FastServe
  paper's first version (fastserve-notes-v1 §Evaluation): a larger theta is more
  skewed (most jobs short, a few long); a smaller theta is closer to uniform and,
  with the bound, has more tokens in all.

Presets (`PRESETS`), each a prompt and an output distribution plus a context bound:

- `sharegpt`: means 161.31 prompt / 337.99 output tokens — vLLM paper (Kwon et al.,
  SOSP 2023, Fig. 11 legends: "Input (mean: 161.31)", "Output (mean: 337.99)"; "8.4x
  longer input prompts and 5.8x longer outputs ... than Alpaca, with higher variance").
  The paper gives only means; sigma 1.0 (prompt) and 0.9 (output) are our assumption
  for the "higher variance"; requests are bounded to 2048 tokens as in vLLM's
  ShareGPT runs on OPT (2048-token context).
- `alpaca`: means 19.31 prompt / 58.45 output (same figure); sigma 0.6 / 0.8 assumed.
- `azure-conv`: fitted to the shipped Azure 2023 conversation trace
  (data/README.md: prompt mean 1155, p99 4142; output mean 211, p99 601): with
  z99 = 2.3263, sigma solves ln(p99 / mean) = z99 * sigma - sigma^2 / 2, giving
  sigma 0.636 (prompt) and 0.505 (output).
- `prefill-heavy`: long prompts (mean 1536, sigma 0.4), short outputs (mean 16,
  sigma 0.6) — the regime where FCFS's head-of-line blocking is a prefill wall.
- `zipf`: prompt and output both bounded Zipf(theta=1.1) up to 1024 tokens.

Clipping: output first to `max_output` (at least 1), then the prompt to
`max_context - output` (at least 1): a client trims old context, never the answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from fsd.errors import ConfigError


@dataclass(frozen=True)
class Lognormal:
    """Lognormal token counts with a given (unclipped) mean and log-space sigma."""

    mean: float
    sigma: float

    def __post_init__(self) -> None:
        if not self.mean >= 1:
            raise ConfigError(f"lognormal mean must be >= 1 token, got {self.mean}")
        if not self.sigma >= 0:
            raise ConfigError(f"lognormal sigma must be >= 0, got {self.sigma}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        mu = math.log(self.mean) - self.sigma**2 / 2
        return np.maximum(1, np.rint(rng.lognormal(mu, self.sigma, n))).astype(np.int64)

    def describe(self) -> str:
        return f"lognormal(mean={self.mean:g}, sigma={self.sigma:g})"


@dataclass(frozen=True)
class Zipf:
    """Bounded Zipf on [low, high]: P(k) ∝ k^-theta."""

    theta: float
    high: int
    low: int = 1

    def __post_init__(self) -> None:
        if not self.theta >= 0:
            raise ConfigError(f"zipf theta must be >= 0, got {self.theta}")
        if not 1 <= self.low <= self.high:
            raise ConfigError(
                f"zipf bounds must satisfy 1 <= low <= high, got {self.low}..{self.high}"
            )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        # inverse-CDF on the explicit support: exact and deterministic for a seed
        k = np.arange(self.low, self.high + 1, dtype=float)
        cdf = np.cumsum(k**-self.theta)
        cdf /= cdf[-1]
        idx = np.searchsorted(cdf, rng.random(n), side="right")
        return (self.low + np.minimum(idx, len(k) - 1)).astype(np.int64)

    def describe(self) -> str:
        return f"zipf(theta={self.theta:g}, {self.low}..{self.high})"


@dataclass(frozen=True)
class Fixed:
    """Every request has the same count (hand-made tests, calibration)."""

    value: int

    def __post_init__(self) -> None:
        if self.value < 1:
            raise ConfigError(f"fixed length must be >= 1, got {self.value}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def describe(self) -> str:
        return f"fixed({self.value})"


Dist = Lognormal | Zipf | Fixed


@dataclass(frozen=True)
class LengthModel:
    """Prompt and output length distributions, sampled independently, then clipped."""

    name: str
    prompt: Dist
    output: Dist
    max_context: int | None = 2048
    max_output: int | None = None
    notes: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.max_context is not None and self.max_context < 2:
            raise ConfigError(f"max_context must be >= 2 tokens, got {self.max_context}")
        if self.max_output is not None and self.max_output < 1:
            raise ConfigError(f"max_output must be >= 1 token, got {self.max_output}")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, output lengths) of `n` requests, clipped."""
        prompts = self.prompt.sample(n, rng)
        outputs = self.output.sample(n, rng)
        return clip_lengths(prompts, outputs, self.max_context, self.max_output)

    def with_context(self, max_context: int | None) -> LengthModel:
        return replace(self, max_context=max_context)

    def describe(self) -> str:
        bound = f", context<={self.max_context}" if self.max_context else ""
        return (
            f"{self.name}: prompt {self.prompt.describe()}, output {self.output.describe()}{bound}"
        )


def clip_lengths(
    prompts: np.ndarray,
    outputs: np.ndarray,
    max_context: int | None,
    max_output: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Outputs to [1, max_output] and [1, max_context - 1]; prompts to [1, max_context - output]."""
    p = np.maximum(np.asarray(prompts, dtype=np.int64), 1)
    o = np.maximum(np.asarray(outputs, dtype=np.int64), 1)
    if max_output is not None:
        o = np.minimum(o, max_output)
    if max_context is not None:
        o = np.minimum(o, max_context - 1)
        p = np.minimum(p, max_context - o)
    return p, o


PRESETS: dict[str, LengthModel] = {
    "sharegpt": LengthModel(
        "sharegpt", Lognormal(161.31, 1.0), Lognormal(337.99, 0.9), max_context=2048
    ),
    "alpaca": LengthModel("alpaca", Lognormal(19.31, 0.6), Lognormal(58.45, 0.8), max_context=2048),
    "azure-conv": LengthModel(
        "azure-conv", Lognormal(1155, 0.636), Lognormal(211, 0.505), max_context=None
    ),
    "prefill-heavy": LengthModel(
        "prefill-heavy", Lognormal(1536, 0.4), Lognormal(16, 0.6), max_context=2048
    ),
    "zipf": LengthModel("zipf", Zipf(1.1, 1024), Zipf(1.1, 1024), max_context=2048),
}


def length_model(name: str, theta: float | None = None) -> LengthModel:
    """A preset by name; `theta` re-skews the zipf preset."""
    if name not in PRESETS:
        raise ConfigError(f"unknown length model {name!r}; choose one of: {', '.join(PRESETS)}")
    model = PRESETS[name]
    if theta is not None:
        if name != "zipf":
            raise ConfigError(f"theta applies to the zipf length model, not {name!r}")
        high = model.prompt.high  # type: ignore[union-attr]
        model = replace(model, prompt=Zipf(theta, high), output=Zipf(theta, high))
    return model
