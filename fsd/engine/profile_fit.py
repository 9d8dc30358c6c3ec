"""Fitting the cost model to timed iterations (the profiler's measurements).

prefill(n) = base + a*n + b*n^2 and decode(b, C) = base + per_seq*b + per_ctx*C are
fitted by non-negative least squares on relative error (a 16-token prefill matters
as much as a 2k-token one). A point's cost is its fastest repeat: timing noise is
one-sided (another process, a preempted intra-op thread or a page fault only ever
adds time; on a busy 2-core machine a 2 ms step can read 150 ms), so the median is
kept beside it in the notes only. Pure numpy: `fsd.engine.profiler` measures.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fsd.cost import CostModel
from fsd.errors import ConfigError

# A point whose median is more than _NOISE x its fastest repeat is noisy: the
# profiler measures it again, up to `extra_rounds` more times.
_NOISE = 1.5


class _Timed:
    """Repeated timings of one measurement point."""

    times: list[float]

    @property
    def seconds(self) -> float:
        """The fastest repeat: the step's own cost (see `_NOISE` below)."""
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def noisy(self) -> bool:
        return len(self.times) < 2 or statistics.median(self.times) > _NOISE * min(self.times)


@dataclass
class PrefillSample(_Timed):
    """Timed prefills of one job of `num_tokens` tokens."""

    num_tokens: int
    times: list[float] = field(default_factory=list)


@dataclass
class DecodeSample(_Timed):
    """Timed decode steps of `batch_size` jobs, each with `context_len` cached tokens."""

    batch_size: int
    context_len: int
    times: list[float] = field(default_factory=list)

    @property
    def context_tokens(self) -> int:
        return self.batch_size * self.context_len


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min ||a x - y|| subject to x >= 0, exactly, for a handful of unknowns.

    The optimum is the unconstrained least-squares solution on its own support, so
    trying every support (2^k - 1 of them; k = 3 here) and keeping the best feasible
    one is exact and needs no iterative solver. Columns are scaled to unit norm first
    because 1, n and n^2 differ by orders of magnitude.
    """
    a = np.asarray(a, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    k = a.shape[1]
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    scaled = a / norms
    best = np.zeros(k)
    best_err = float(y @ y)
    for mask in range(1, 2**k):
        cols = [j for j in range(k) if mask >> j & 1]
        x, *_ = np.linalg.lstsq(scaled[:, cols], y, rcond=None)
        if (x < 0).any():
            continue
        err = float(np.sum((scaled[:, cols] @ x - y) ** 2))
        if err < best_err * (1 - 1e-12):
            best = np.zeros(k)
            best[cols] = x
            best_err = err
    return best / norms


def _relative_fit(rows: list[list[float]], times: list[float]) -> np.ndarray:
    # Divide each row by its time: the fit minimises relative error, so short steps
    # (q1 is the shortest) are predicted as well as long ones.
    a = np.array(rows, dtype=np.float64)
    t = np.array(times, dtype=np.float64)
    return nnls(a / t[:, None], np.ones_like(t))


def fit_prefill(samples: Sequence[PrefillSample]) -> tuple[float, float, float]:
    """(base, per_token, per_token2) >= 0 fitted to the samples' fastest repeats."""
    if not samples:
        raise ConfigError("no prefill measurements to fit")
    rows = [[1.0, s.num_tokens, float(s.num_tokens) ** 2] for s in samples]
    base, a, b = _relative_fit(rows, [s.seconds for s in samples])
    return float(base), float(a), float(b)


def fit_decode(samples: Sequence[DecodeSample]) -> tuple[float, float, float]:
    """(base, per_seq, per_ctx_token) >= 0 fitted to the samples' fastest repeats."""
    if not samples:
        raise ConfigError("no decode measurements to fit")
    rows = [[1.0, s.batch_size, s.context_tokens] for s in samples]
    base, per_seq, per_ctx = _relative_fit(rows, [s.seconds for s in samples])
    return float(base), float(per_seq), float(per_ctx)


def _residuals(measured: list[float], fitted: list[float]) -> dict[str, float]:
    rel = [(f - m) / m for m, f in zip(measured, fitted, strict=True)]
    return {
        "rel_rms": float(np.sqrt(np.mean(np.square(rel)))) if rel else 0.0,
        "max_abs_rel": float(max((abs(r) for r in rel), default=0.0)),
    }


def fit_cost_model(
    prefill: Sequence[PrefillSample],
    decode: Sequence[DecodeSample],
    *,
    name: str = "measured",
    kv_bytes_per_token: int = 0,
    swap_bytes_per_s: float = 16e9,
    notes: dict[str, object] | None = None,
) -> CostModel:
    """Fit both phases and return a CostModel whose notes hold every point and residual."""
    p_base, p_a, p_b = fit_prefill(prefill)
    d_base, d_seq, d_ctx = fit_decode(decode)
    cost = CostModel(
        name=name,
        prefill_base=p_base,
        prefill_per_token=p_a,
        prefill_per_token2=p_b,
        decode_base=d_base,
        decode_per_seq=d_seq,
        decode_per_ctx_token=d_ctx,
        kv_bytes_per_token=kv_bytes_per_token,
        swap_bytes_per_s=swap_bytes_per_s,
    )
    p_fit = [cost.prefill_time(s.num_tokens) for s in prefill]
    d_fit = [cost.decode_time(s.batch_size, s.context_tokens) for s in decode]
    all_notes: dict[str, object] = dict(notes or {})
    all_notes["prefill"] = [
        {
            "tokens": s.num_tokens,
            "measured_s": s.seconds,
            "median_s": s.median,
            "fitted_s": f,
            "samples_s": s.times,
        }
        for s, f in zip(prefill, p_fit, strict=True)
    ]
    all_notes["decode"] = [
        {
            "batch": s.batch_size,
            "context": s.context_len,
            "measured_s": s.seconds,
            "median_s": s.median,
            "fitted_s": f,
            "samples_s": s.times,
        }
        for s, f in zip(decode, d_fit, strict=True)
    ]
    all_notes["fit"] = {
        "method": "non-negative least squares on relative error, fastest of the repeats",
        "prefill": _residuals([s.seconds for s in prefill], p_fit),
        "decode": _residuals([s.seconds for s in decode], d_fit),
    }
    return replace(cost, notes=all_notes)
