"""Fitting the cost model to timed iterations (the profiler's measurements).

prefill(n) = base + a*n + b*n^2 and decode(b, C) = base + per_seq*b + per_ctx*C are
fitted by non-negative least squares on relative error (a 16-token prefill matters
as much as a 2k-token one). A prefill chunk of n tokens over c cached ones then
fits one more term: what it takes beyond prefill(n) + decode_per_ctx_token * c
(reading the cached KV) is prefill_per_ctx_token * n * c (`fit_chunk`); without
chunks that term is derived as 2 x prefill_per_token2. A point's cost is its
fastest repeat: timing noise is one-sided (another process, a preempted intra-op
thread or a page fault only ever adds time; on a busy 2-core machine a 2 ms step
can read 150 ms), so the median is kept beside it in the notes only. Pure numpy:
`fsd.engine.profiler` measures.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fsd.cost.model import CostModel
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

    @property
    def specs(self) -> list[tuple[int, int]]:
        """The iteration as the profiler runs it: (tokens, already computed) per job."""
        return [(self.num_tokens, 0)]

    @property
    def label(self) -> str:
        return f"prefill {self.num_tokens} tokens"


@dataclass
class DecodeSample(_Timed):
    """Timed decode steps of `batch_size` jobs, each with `context_len` cached tokens."""

    batch_size: int
    context_len: int
    times: list[float] = field(default_factory=list)

    @property
    def context_tokens(self) -> int:
        return self.batch_size * self.context_len

    @property
    def specs(self) -> list[tuple[int, int]]:
        # each job holds `context_len` tokens, all but the last already in the cache
        return [(self.context_len, self.context_len - 1)] * self.batch_size

    @property
    def label(self) -> str:
        return f"decode batch {self.batch_size} x {self.context_len} context"


@dataclass
class ChunkSample(_Timed):
    """Timed prefill chunks of `num_tokens` new tokens over `cached` ones in the KV cache."""

    num_tokens: int
    cached: int
    times: list[float] = field(default_factory=list)

    @property
    def specs(self) -> list[tuple[int, int]]:
        return [(self.cached + self.num_tokens, self.cached)]

    @property
    def label(self) -> str:
        return f"chunk {self.num_tokens} tokens over {self.cached}"


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


def fit_chunk(samples: Sequence[ChunkSample], cost: CostModel) -> float:
    """prefill_per_ctx_token >= 0, with the other terms already fitted (`cost`).

    A chunk's time beyond prefill(n) and reading its c cached tokens' KV
    (decode_per_ctx_token * c) is fitted against n * c, on relative error like the
    rest; a chunk that costs no more than that gives 0.
    """
    pts = [s for s in samples if s.cached > 0 and s.num_tokens > 0]
    if not pts:
        raise ConfigError("no prefill chunk over a cached context to fit")
    t = np.array([s.seconds for s in pts], dtype=np.float64)
    pairs = np.array([float(s.num_tokens * s.cached) for s in pts])
    known = np.array(
        [cost.prefill_time(s.num_tokens) + cost.decode_per_ctx_token * s.cached for s in pts]
    )
    (per_ctx,) = nnls((pairs / t)[:, None], (t - known) / t)
    return float(per_ctx)


def chunk_series(prompt: int, chunk: int) -> list[tuple[int, int]]:
    """(new tokens, cached tokens) of each chunk of a `prompt`-token prefill."""
    step = chunk if 0 < chunk < prompt else prompt
    return [(min(step, prompt - c), c) for c in range(0, prompt, step)]


def chunk_slowdown(
    cost: CostModel,
    prompt: int,
    chunks: Sequence[int],
    measured: dict[tuple[int, int], float] | None = None,
) -> dict[str, dict[str, float]]:
    """{chunk: {"predicted": ratio, "measured": ratio}}: how much longer a `prompt`-token
    prefill takes in chunks, each an iteration of its own, than in one piece.

    `measured` maps (new tokens, cached tokens) to seconds ((n, 0): a whole prefill);
    a ratio is measured when every chunk of its series and the whole prompt are in it.
    """
    whole = (measured or {}).get((prompt, 0))
    out: dict[str, dict[str, float]] = {}
    for k in chunks:
        entry = {"predicted": cost.chunked_prefill_time(prompt, k) / cost.prefill_time(prompt)}
        series = chunk_series(prompt, k)
        if measured and whole and all(p in measured for p in series):
            entry["measured"] = sum(measured[p] for p in series) / whole
        out[str(k)] = entry
    return out


def _point_notes(samples: Sequence[_Timed], fitted: list[float], keys: list[dict]) -> list[dict]:
    return [
        {**key, "measured_s": s.seconds, "median_s": s.median, "fitted_s": f, "samples_s": s.times}
        for s, f, key in zip(samples, fitted, keys, strict=True)
    ]


def _chunk_notes(
    cost: CostModel,
    measured: bool,
    prompt: int,
    sizes: Sequence[int],
    times: dict[tuple[int, int], float],
) -> dict[str, object]:
    how = (
        "measured: the chunks' time beyond prefill(n) + decode_per_ctx_token * c, fitted "
        "against n * c"
        if measured
        else "derived, not measured (quick profile): 2 x prefill_per_token2, the attention "
        "math of the n x c pairs alone"
    )
    return {
        "prefill_per_ctx_token": how,
        "derived_prefill_per_ctx_token": 2 * cost.prefill_per_token2,
        "prompt_tokens": prompt,
        "slowdown": chunk_slowdown(cost, prompt, sizes, times),
        "slowdown_is": "chunked_prefill_time / prefill_time of the prompt, each chunk an "
        "iteration of its own (paying prefill_base); measured: the chunks' fastest repeats "
        "summed over the whole prompt's",
    }


def fit_cost_model(
    prefill: Sequence[PrefillSample],
    decode: Sequence[DecodeSample],
    chunk: Sequence[ChunkSample] = (),
    *,
    name: str = "measured",
    kv_bytes_per_token: int = 0,
    swap_bytes_per_s: float = 16e9,
    chunk_prompt: int = 2048,
    chunk_sizes: Sequence[int] = (256, 512),
    notes: dict[str, object] | None = None,
) -> CostModel:
    """Fit every phase and return a CostModel whose notes hold every point and residual.

    No chunk over a cached context: prefill_per_ctx_token is derived as 2 x
    prefill_per_token2 (the notes say so). `chunk_prompt` and `chunk_sizes`: the chunked prefill whose
    slowdown over a whole one the notes report (`chunk_slowdown`).
    """
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
    measured = any(s.cached > 0 and s.num_tokens > 0 for s in chunk)
    per_ctx = fit_chunk(chunk, cost) if measured else 2 * p_b
    cost = replace(cost, prefill_per_ctx_token=per_ctx)
    p_fit = [cost.prefill_time(s.num_tokens) for s in prefill]
    d_fit = [cost.decode_time(s.batch_size, s.context_tokens) for s in decode]
    c_fit = [cost.chunk_time(s.num_tokens, s.cached) for s in chunk]
    times = {(s.num_tokens, 0): s.seconds for s in prefill}
    times.update({(s.num_tokens, s.cached): s.seconds for s in chunk})
    all_notes: dict[str, object] = dict(notes or {})
    all_notes["prefill"] = _point_notes(prefill, p_fit, [{"tokens": s.num_tokens} for s in prefill])
    all_notes["decode"] = _point_notes(
        decode, d_fit, [{"batch": s.batch_size, "context": s.context_len} for s in decode]
    )
    all_notes["chunk"] = _point_notes(
        chunk, c_fit, [{"tokens": s.num_tokens, "cached": s.cached} for s in chunk]
    )
    all_notes["fit"] = {
        "method": "non-negative least squares on relative error, fastest of the repeats",
        "prefill": _residuals([s.seconds for s in prefill], p_fit),
        "decode": _residuals([s.seconds for s in decode], d_fit),
        "chunk": _residuals([s.seconds for s in chunk], c_fit),
    }
    all_notes["chunked_prefill"] = _chunk_notes(cost, measured, chunk_prompt, chunk_sizes, times)
    return replace(cost, notes=all_notes)
