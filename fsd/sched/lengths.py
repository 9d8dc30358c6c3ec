"""Gittins index of a job's output length, learned from recently finished jobs.

Why: MLFQ demotes a job once it has used its quantum, betting that a job which has
run for a while will run for longer still (a decreasing hazard, true of heavy-tailed
outputs). When outputs are alike (a burst of requests capped at the same max_tokens)
the bet is wrong: a job halfway done is the closest to finishing, and demoting it
turns MLFQ into round robin, where every job of a burst finishes at its end.

The Gittins index makes the bet from data. For a job that has generated `a` tokens,

    G(a) = sup_{d > 0} E[1{L - a <= d} / L | L > a] / E[min(L - a, d) | L > a],

the best rate at which service to it buys completions, each worth 1/L because the
metric is per-token latency (end-to-end / L). Among non-clairvoyant orders the
Gittins order is optimal for the weighted mean, and it reduces to FCFS when the hazard
rises and to least-attained-service when it falls. The unweighted index (mean
response time) kept conversation jobs of 50-130 tokens ahead of fresh ones and lost
to plain MLFQ on every loaded workload of bench/policies.py. fsd keeps MLFQ's levels and consults the
index only at a quantum's end: a job whose index is still above a fresh job's keeps
its level and place instead of dropping one level.

Cold start: before `min_samples` jobs have finished, all that is known of a length is
its cap (max_tokens): a uniform prior on [1, cap], whose hazard rises, so a started
job's index grows with progress and, among jobs of one cap, it keeps its place as
FCFS would (demoting is round robin on a burst worked off before anything finishes).
Across caps the prior compares what is left: a started job keeps its level only while
it expects fewer tokens left than the shortest-capped job waiting to start would take
(keeping every started job in place whatever the caps held long jobs ahead of short
arrivals for minutes: bench/live_scene.py). Jobs without a cap keep their place.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

QUANTILES = (0.1, 0.5, 0.9, 0.99)
UNKNOWN_CAP = 1 << 20  # a max_tokens this large says nothing (the simulator's jobs)
AHEAD = 64  # a decoding job's next ranks, computed at once (it asks for one per step)
CACHED = 8192  # entries per cache: a bound, not a tuned size


@dataclass(frozen=True)
class LearnedLengths:
    """What a policy learned of output lengths from finished jobs, as telemetry shows it.

    `quantiles`: (q, output tokens) for QUANTILES over the window; `by_prompt`: per
    prompt-length class, (prompt tokens up to, samples, median output tokens); empty
    when the policy does not condition on the prompt.
    """

    samples: int
    ready: bool
    mean: float | None
    quantiles: tuple[tuple[float, int], ...]
    by_prompt: tuple[tuple[int, int, int], ...] = ()


class OutputLengthIndex:
    """Gittins indices of generated-token counts, from the last `window` finished jobs.

    Until `min_samples` jobs have finished, `ready` is False and `keeps_level` uses the
    cold-start prior (module docstring). Jobs that ended by abort or error are not
    observed: their lengths are not outputs the model chose.
    """

    def __init__(self, window: int = 256, min_samples: int = 32, refresh: int = 16) -> None:
        if window < 1 or min_samples < 1 or refresh < 1:
            raise ValueError("window, min_samples and refresh must be >= 1")
        self.window = window
        self.min_samples = min(min_samples, window)
        self.refresh = refresh
        self._recent: deque[int] = deque(maxlen=window)
        self._sorted: list[int] = []
        self._lengths = np.zeros(0, dtype=np.int64)  # `_sorted` as an array, and 1 / it
        self._inverse = np.zeros(0)
        self._stale = 0  # observations since `_sorted` was rebuilt
        self._suffix = np.zeros(1)  # _suffix[i] = sum(_lengths[i:])
        self._cache: dict[int, float] = {}
        self._steps: dict[tuple[int, int], float] = {}
        self._left: dict[int, float | None] = {}
        self._ahead: dict[int, tuple[float, float]] = {}  # attained -> (weight_mean, steps)
        self._mean_inverse = 1.0
        self.version = 0  # bumped at each rebuild: ranks computed before are stale

    def __len__(self) -> int:
        return len(self._recent)

    @property
    def ready(self) -> bool:
        return len(self._sorted) >= self.min_samples

    def observe(self, output_tokens: int) -> None:
        """A job finished after generating `output_tokens` tokens."""
        self._recent.append(max(int(output_tokens), 1))
        self._stale += 1
        if self._stale >= self.refresh or len(self._sorted) < self.min_samples:
            self._sorted = sorted(self._recent)
            self._lengths = np.array(self._sorted, dtype=np.int64)
            self._inverse = 1.0 / self._lengths
            self._suffix = np.concatenate([np.cumsum(self._lengths[::-1])[::-1], [0.0]])
            self._mean_inverse = float(self._inverse.mean())
            self._stale = 0
            self._cache.clear()
            self._steps.clear()
            self._left.clear()
            self._ahead.clear()
            self.version += 1

    @property
    def mean_inverse(self) -> float:
        """E[1/L] over the window (the per-token weight's mean)."""
        return self._mean_inverse

    def mean_left(self, attained: int) -> float | None:
        """E[L - attained | L > attained] in tokens; None once it outlived every sample."""
        try:
            return self._left[attained]
        except KeyError:
            pass
        start = bisect.bisect_right(self._sorted, attained)
        m = len(self._sorted) - start
        left = float(self._suffix[start]) / m - attained if m else None
        if len(self._left) < CACHED:
            self._left[attained] = left
        return left

    def rank_steps(self, attained: int, prefill_steps: float, weight_mean: float) -> float:
        """1 / Gittins index of the job's remaining service, in decode steps.

        Service left = `prefill_steps` (its prompt, known) + one step per output token
        left (learned); each completion is worth (1/L) / `weight_mean`. The same
        sweep over horizons as `index`, with the prefill paid by every survivor.
        Equals the job's remaining service when every sample has the same length.
        """
        key = (attained, round(prefill_steps * 64))
        cached = self._steps.get(key)
        if cached is not None:
            return cached
        if prefill_steps == 0.0:
            best = self._decode_steps(attained, weight_mean)
        else:
            start = bisect.bisect_right(self._sorted, attained)
            m = len(self._sorted) - start
            best = math.inf
            if m:
                rest = self._lengths[start:] - attained
                gain = np.cumsum(self._inverse[start:]) / weight_mean
                spent = m * prefill_steps + np.cumsum(rest) + np.arange(m - 1, -1, -1) * rest
                best = float((spent / gain).min())
        if len(self._steps) < CACHED:
            self._steps[key] = best
        return best

    def _decode_steps(self, attained: int, weight_mean: float) -> float:
        """`rank_steps` with no prefill left, for the next AHEAD attained counts at once
        (while the same samples outlive them): one array pass per AHEAD decode steps
        instead of one per step. Integer service makes each value exactly the one-at-
        a-time sweep's; a value is used only under the `weight_mean` it was made with."""
        ahead = self._ahead.get(attained)
        if ahead is not None and ahead[0] == weight_mean:
            return ahead[1]
        start = bisect.bisect_right(self._sorted, attained)
        m = len(self._sorted) - start
        if not m:
            return math.inf
        lengths = self._lengths[start:]
        upto = min(attained + AHEAD, int(lengths[0]))  # below the next sample: same survivors
        rest = lengths[None, :] - np.arange(attained, upto)[:, None]
        gain = np.cumsum(self._inverse[start:]) / weight_mean
        spent = np.cumsum(rest, axis=1) + np.arange(m - 1, -1, -1) * rest
        best = (spent / gain).min(axis=1).tolist()
        if len(self._ahead) < CACHED:
            for i, steps in enumerate(best):
                self._ahead[attained + i] = (weight_mean, steps)
        return best[0]

    def index(self, attained: int) -> float:
        """G(attained), 1/L-weighted completions per token; 0 once it outlived every sample."""
        cached = self._cache.get(attained)
        if cached is not None:
            return cached
        xs = self._sorted
        start = bisect.bisect_right(xs, attained)
        m = len(xs) - start
        best = 0.0
        if m:
            # candidate horizons d = each survivor's remaining length; by the k-th, k
            # survivors finished (worth 1/L each) and the service spent is the finished
            # ones' remaining plus d for each of the m - k still running
            rest = self._lengths[start:] - attained
            gain = np.cumsum(self._inverse[start:])
            spent = np.cumsum(rest) + np.arange(m - 1, -1, -1) * rest
            best = float((gain / spent).max())
        if len(self._cache) < CACHED:
            self._cache[attained] = best
        return best

    def summary(self) -> LearnedLengths:
        """The window's size, mean and quantiles (telemetry)."""
        xs = list(self._recent)
        if not xs:
            return LearnedLengths(0, False, None, ())
        arr = np.sort(np.array(xs))
        qs = tuple((q, int(arr[min(int(q * len(arr)), len(arr) - 1)])) for q in QUANTILES)
        return LearnedLengths(len(xs), self.ready, float(arr.mean()), qs)

    def keeps_level(self, attained: int, cap: int = 0, fresh_cap: int = 0) -> bool:
        """Whether a job with `attained` output tokens should outrank a fresh job.
        Cold start: `cap` is its max_tokens, `fresh_cap` the smallest of the jobs
        waiting to start (0: none known)."""
        if not self.ready:
            if 0 < cap < UNKNOWN_CAP and 0 < fresh_cap < UNKNOWN_CAP:
                return cap - attained < fresh_cap  # uniform priors: what is left, halved
            return attained > 0  # the uniform prior's index rises with progress
        cache = self._cache  # (most calls: two lookups, no call)
        here, first = cache.get(attained), cache.get(0)
        return (self.index(attained) if here is None else here) > (
            self.index(0) if first is None else first
        )
