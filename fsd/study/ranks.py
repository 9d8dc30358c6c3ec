"""Ranks of jobs' remaining service: the prompt is known, the output learned by prompt class.

Why by prompt class (SOAP, Scully et al. 2018: a job's descriptor conditions its
size distribution): a prefill-heavy service (2k-token code prompts) and a chat
service have different output lengths, and the prompt length tells them apart
before the first token. Each class (prompt tokens in [2^k, 2^(k+1)) x 128) keeps
its own window of finished outputs once it has `min_samples`; until then the pooled
window stands in, and before that nothing is learned (`ready` False).

A job's rank is 1 / its Gittins index, in seconds: the least expected service per
per-token-weighted completion over any horizon. It is the job's remaining service
when outputs are alike, and it rises for a job that outlived the short outputs of a
heavy-tailed class (least-attained-service behaviour), so one rule covers both.
"""

from __future__ import annotations

import math

from fsd.sched.lengths import UNKNOWN_CAP, LearnedLengths, OutputLengthIndex

CLASS_BASE = 128  # prompt tokens of the first class's upper edge
MAX_CLASS = 10  # 128 * 2^10 = 131k tokens and beyond share the last class


def prompt_class(prompt_tokens: int) -> int:
    """0 for prompts under 128 tokens, then one class per doubling."""
    return min(max(prompt_tokens // CLASS_BASE, 0).bit_length(), MAX_CLASS)


class ServiceRanks:
    """Output lengths learned from finished jobs, per prompt class and pooled."""

    def __init__(
        self, window: int = 256, min_samples: int = 32, refresh: int = 16, by_prompt: bool = True
    ) -> None:
        self.min_samples = min_samples
        self.by_prompt = by_prompt  # False: the pooled window for every job
        self.pooled = OutputLengthIndex(window, min_samples, refresh)
        self._classes: dict[int, OutputLengthIndex] = {}
        self._args = (window, min_samples, refresh)
        self.version = 0  # bumped whenever a window a rank reads is rebuilt
        self._window: dict[int, OutputLengthIndex] = {}  # `sample`, until the next bump

    @property
    def ready(self) -> bool:
        return self.pooled.ready

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        cls = prompt_class(prompt_tokens)
        index = self._classes.get(cls)
        if index is None:
            index = self._classes[cls] = OutputLengthIndex(*self._args)
        before = (self.pooled.version, index.version)
        self.pooled.observe(output_tokens)
        index.observe(output_tokens)
        if (self.pooled.version, index.version) != before:
            self.version += 1
            self._window.clear()  # a window's readiness changes only when it is rebuilt

    def pool_only(self, pooled: bool) -> None:
        """Read every job's lengths from the pooled window (True) or its class's."""
        if self.by_prompt == pooled:
            self.by_prompt = not pooled
            self._window.clear()  # each prompt's window depends on it

    def windows(self) -> list[tuple[int, OutputLengthIndex]]:
        """(id, window) of the pool and of every class (versions tell which were rebuilt)."""
        return [(id(self.pooled), self.pooled)] + [(id(w), w) for w in self._classes.values()]

    def sample(self, prompt_tokens: int) -> OutputLengthIndex:
        """The window that describes a job with this prompt: its class's, or the pool's."""
        window = self._window.get(prompt_tokens)
        if window is None:
            window = self.window_of(prompt_class(prompt_tokens))
            if len(self._window) < 8192:
                self._window[prompt_tokens] = window
        return window

    def window_of(self, cls: int) -> OutputLengthIndex:
        """The window that describes a prompt class: its own once ready, else the pool."""
        index = self._classes.get(cls) if self.by_prompt else None
        return index if index is not None and index.ready else self.pooled

    @staticmethod
    def has_prior(cap: int) -> bool:
        """Whether a job's max_tokens cap tells anything before outputs are learned."""
        return 0 < cap < UNKNOWN_CAP

    @staticmethod
    def _prior_left(attained: int, cap: int) -> float:
        """Tokens left under the cold-start prior: uniform up to the cap (else one)."""
        return max((cap - attained) / 2.0, 1.0) if 0 < cap < UNKNOWN_CAP else 1.0

    def measure(
        self, prompt_tokens: int, attained: int, prefill_s: float, step_s: float, cap: int = 0
    ) -> tuple[float, float]:
        """(`rank`, `expected_left`) of one job: one window lookup for both (the
        default policy re-ranks every job that ran, every iteration)."""
        stepped = max(step_s, 1e-9)
        if not self.ready:
            tokens = self._prior_left(attained, cap)
            return prefill_s + stepped * tokens, prefill_s + step_s * tokens
        index = self.sample(prompt_tokens)
        rank = index.rank_steps(attained, prefill_s / stepped, self.pooled.mean_inverse) * stepped
        left = index.mean_left(attained)
        if left is None:
            left = self._prior_left(attained, cap)
        return rank, prefill_s + step_s * left

    def rank(
        self, prompt_tokens: int, attained: int, prefill_s: float, step_s: float, cap: int = 0
    ) -> float:
        """Seconds of service per weighted completion (1 / Gittins index); inf past
        every sample. Before anything is learned: the expected remaining service under
        a uniform prior up to the job's max_tokens `cap` (a rising hazard: a started
        job only gets closer to done), or the known part alone without a cap."""
        return self.measure(prompt_tokens, attained, prefill_s, step_s, cap)[0]

    def expected_left(
        self, prompt_tokens: int, attained: int, prefill_s: float, step_s: float, cap: int = 0
    ) -> float:
        """E[remaining service] in seconds: the prefill left and the tokens expected."""
        return self.measure(prompt_tokens, attained, prefill_s, step_s, cap)[1]

    def summary(self) -> LearnedLengths:
        """The pooled window, and each class's median (telemetry)."""
        base = self.pooled.summary()
        classes = []
        for cls in sorted(self._classes):
            s = self._classes[cls].summary()
            median = dict(s.quantiles).get(0.5, 0)
            upto = CLASS_BASE << cls if cls < MAX_CLASS else math.inf
            classes.append((int(min(upto, 2**31 - 1)), s.samples, median))
        return LearnedLengths(base.samples, base.ready, base.mean, base.quantiles, tuple(classes))
