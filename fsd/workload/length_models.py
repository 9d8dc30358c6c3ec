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
  (scenarios/traces/README.md: prompt mean 1155, p99 4142; output mean 211, p99 601): with
  z99 = 2.3263, sigma solves ln(p99 / mean) = z99 * sigma - sigma^2 / 2, giving
  sigma 0.636 (prompt) and 0.505 (output).
- `prefill-heavy`: long prompts (mean 1536, sigma 0.4), short outputs (mean 16,
  sigma 0.6) — the regime where FCFS's head-of-line blocking is a prefill wall.
- `zipf`: prompt and output both bounded Zipf(theta=1.1) up to 1024 tokens.

Validation shapes (the regimes a policy should be checked in besides chat):

- `code-bursty`: a code-completion service, prefill-dominated. Medians 1500 prompt /
  13 output tokens — the Azure 2023 coding trace as Splitwise (Patel et al., ISCA 2024,
  §III) reports it. The spreads are our assumption: prompt sigma 0.9 (about 3% of
  prompts past 8k tokens), capped at 16,384; output sigma 1.4 (p99 about 340, a tail to
  about 1000), capped at 1024. No context bound of its own (the simulator clips to the
  profile's). Its burstiness is in the arrivals: pair it with `gamma` and a high CV.
- `alike`: light-tailed, alike jobs: prompts uniform on 240..360 (300 ± 60), outputs
  uniform on 160..240 (200 ± 40). Our construction: the regime where size-based
  scheduling has nothing to exploit, so every policy should tie with FCFS.
- `summarize`: long documents, short summaries: prompts uniform on 2048..6144, outputs
  uniform on 100..300. Our assumption for a summarization service; a prefill-heavy
  load whose prompts all need a long-context profile.
- `decode-heavy`: short prompts, long generations: prompts lognormal median 100
  (sigma 0.5), outputs lognormal median 800 (sigma 0.6, capped at 4096). Our
  assumption, the mirror of prefill-heavy: decode steps and the KV they grow dominate.

Mixtures of two services (`Mixture`, `mixture(a, b, weight)`, or by name
`mix:A+B:W`, e.g. `mix:sharegpt+code-bursty:0.3`): each request is drawn whole — its
prompt and output together — from A with probability W, else from B (W defaults to
0.5; A and B are preset names). Each component keeps its own bounds.

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
    """Lognormal token counts with a given (uncapped) mean and log-space sigma, capped
    at `high` tokens when given."""

    mean: float
    sigma: float
    high: int | None = None

    def __post_init__(self) -> None:
        if not self.mean >= 1:
            raise ConfigError(f"lognormal mean must be >= 1 token, got {self.mean}")
        if not self.sigma >= 0:
            raise ConfigError(f"lognormal sigma must be >= 0, got {self.sigma}")
        if self.high is not None and self.high < 1:
            raise ConfigError(f"lognormal cap (high) must be >= 1 token, got {self.high}")

    @classmethod
    def from_median(cls, median: float, sigma: float, high: int | None = None) -> Lognormal:
        """The lognormal with this median (what traces report): mean = median e^(sigma²/2)."""
        if not median >= 1:
            raise ConfigError(f"lognormal median must be >= 1 token, got {median}")
        return cls(median * math.exp(sigma**2 / 2), sigma, high)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        mu = math.log(self.mean) - self.sigma**2 / 2
        x = np.maximum(1, np.rint(rng.lognormal(mu, self.sigma, n))).astype(np.int64)
        return x if self.high is None else np.minimum(x, self.high)

    def describe(self) -> str:
        cap = f", high={self.high}" if self.high is not None else ""
        return f"lognormal(mean={self.mean:g}, sigma={self.sigma:g}{cap})"


@dataclass(frozen=True)
class Uniform:
    """Token counts uniform on the integers low..high (both included): light-tailed."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ConfigError(
                f"uniform bounds must satisfy 1 <= low <= high, got {self.low}..{self.high}"
            )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, n, dtype=np.int64)

    def describe(self) -> str:
        return f"uniform({self.low}..{self.high})"


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


Dist = Lognormal | Zipf | Fixed | Uniform


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
        _check_bounds(self.max_context, self.max_output)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, output lengths) of `n` requests, clipped."""
        prompts = self.prompt.sample(n, rng)
        outputs = self.output.sample(n, rng)
        return clip_lengths(prompts, outputs, self.max_context, self.max_output)

    def with_context(self, max_context: int | None) -> LengthModel:
        return replace(self, max_context=max_context)

    def describe(self) -> str:
        bound = _bound_text(self.max_context)
        return (
            f"{self.name}: prompt {self.prompt.describe()}, output {self.output.describe()}{bound}"
        )


def _check_bounds(max_context: int | None, max_output: int | None) -> None:
    """A model's clipping bounds: room for a prompt token and an output token."""
    if max_context is not None and max_context < 2:
        raise ConfigError(f"max_context must be >= 2 tokens, got {max_context}")
    if max_output is not None and max_output < 1:
        raise ConfigError(f"max_output must be >= 1 token, got {max_output}")


def _bound_text(max_context: int | None) -> str:
    """The context bound as a description ends with it ("" when unbounded)."""
    return f", context<={max_context}" if max_context else ""


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
    "code-bursty": LengthModel(
        "code-bursty",
        Lognormal.from_median(1500, 0.9, high=16384),
        Lognormal.from_median(13, 1.4, high=1024),
        max_context=None,
    ),
    "alike": LengthModel("alike", Uniform(240, 360), Uniform(160, 240), max_context=None),
    "summarize": LengthModel("summarize", Uniform(2048, 6144), Uniform(100, 300), max_context=None),
    "decode-heavy": LengthModel(
        "decode-heavy",
        Lognormal.from_median(100, 0.5),
        Lognormal.from_median(800, 0.6, high=4096),
        max_context=None,
    ),
}


MIX_PREFIX = "mix:"
_MIX_FORM = "mix:A+B:W (A and B preset names, W the fraction of A in [0, 1], default 0.5)"


@dataclass(frozen=True)
class Mixture:
    """Two services' requests interleaved: each request is drawn whole (prompt and output
    together) from `a` with probability `weight`, else from `b`; then clipped to this
    mixture's own bounds (each component has already applied its own)."""

    a: LengthModel | Mixture
    b: LengthModel | Mixture
    weight: float
    name: str = ""  # empty: mix:A+B:W from the components' names
    max_context: int | None = None
    max_output: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 1:  # also refuses NaN
            raise ConfigError(
                f"mixture weight must be in [0, 1] (the fraction of {self.a.name}), "
                f"got {self.weight}"
            )
        if not self.name:
            object.__setattr__(self, "name", f"mix:{self.a.name}+{self.b.name}:{self.weight:g}")
        _check_bounds(self.max_context, self.max_output)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, output lengths) of `n` requests, each from one component."""
        from_a = rng.random(n) < self.weight
        prompts = np.empty(n, dtype=np.int64)
        outputs = np.empty(n, dtype=np.int64)
        prompts[from_a], outputs[from_a] = self.a.sample(int(from_a.sum()), rng)
        prompts[~from_a], outputs[~from_a] = self.b.sample(int((~from_a).sum()), rng)
        return clip_lengths(prompts, outputs, self.max_context, self.max_output)

    def with_context(self, max_context: int | None) -> Mixture:
        """Bound the whole mixture (the components keep their own bounds too)."""
        return replace(self, max_context=max_context)

    def describe(self) -> str:
        bound = _bound_text(self.max_context)
        return (
            f"{self.name}: {self.weight:g} x ({self.a.describe()}) + "
            f"{1 - self.weight:g} x ({self.b.describe()}){bound}"
        )


Lengths = LengthModel | Mixture  # what `length_model` returns: both sample (prompts, outputs)


def mixture(a: str | Lengths, b: str | Lengths, weight: float = 0.5) -> Mixture:
    """A mixture of two length models (or preset names): a fraction `weight` from `a`."""
    first = length_model(a) if isinstance(a, str) else a
    second = length_model(b) if isinstance(b, str) else b
    return Mixture(first, second, weight)


def length_model(name: str, theta: float | None = None) -> Lengths:
    """A preset by name, or a mixture `mix:A+B:W`; `theta` re-skews the zipf preset."""
    if name.startswith(MIX_PREFIX):
        if theta is not None:
            raise ConfigError(f"theta applies to the zipf length model, not {name!r}")
        return _parse_mixture(name)
    if name not in PRESETS:
        raise ConfigError(
            f"unknown length model {name!r}; choose one of: {', '.join(PRESETS)}, or {_MIX_FORM}"
        )
    model = PRESETS[name]
    if theta is not None:
        if name != "zipf":
            raise ConfigError(f"theta applies to the zipf length model, not {name!r}")
        high = model.prompt.high  # type: ignore[union-attr]
        model = replace(model, prompt=Zipf(theta, high), output=Zipf(theta, high))
    return model


def _parse_mixture(name: str) -> Mixture:
    """`mix:A+B` or `mix:A+B:W`, with errors that say which part is wrong."""
    body = name[len(MIX_PREFIX) :]
    pair, colon, weight_text = body.partition(":")
    parts = pair.split("+")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"length model {name!r}: a mixture is {_MIX_FORM}")
    for part in parts:
        if part not in PRESETS:
            raise ConfigError(
                f"length model {name!r}: unknown component {part!r}; "
                f"choose from: {', '.join(PRESETS)}"
            )
    weight = 0.5
    if colon:
        try:
            weight = float(weight_text)
        except ValueError:
            weight = math.nan
        if not 0 <= weight <= 1:  # NaN too
            raise ConfigError(
                f"length model {name!r}: weight {weight_text!r} is not a number in [0, 1] "
                f"(the fraction of {parts[0]})"
            )
    return Mixture(PRESETS[parts[0]], PRESETS[parts[1]], weight, name=name)
