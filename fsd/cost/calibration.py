"""Live cost: the profile's predictions recalibrated online from measured iterations.

Why: MLFQ charges each job the cost model's prediction of its iteration. The model is
fitted once, at start-up, on an idle machine; on a busier or slower one (other
processes on the CPU, a larger batch than the quick profile saw, thermal limits) the
real iterations can take 100x longer. Quanta, starvation limits and the SLO are in
seconds, so a job charged in profile seconds then crosses its quantum 100x too late
and sits at its level for minutes of wall time. `LiveCost` learns the ratio of
measured to predicted iteration time; the scheduler charges service x that ratio,
i.e. in measured seconds.

The estimate is an exponentially weighted mean of log(measured / predicted):

- in log space (a geometric mean) because the error is a factor, and a factor is
  what an outlier is (a GC pause, a page fault on the first large batch): one
  sample moves the scale by at most its ratio ** WEIGHT, not by WEIGHT x its ratio;
- with WEIGHT = 0.1: about the last 10 iterations count (a tenth of a second to a
  few seconds of serving), quick enough to follow a machine that gets busy,
  slow enough that one odd iteration is not a new regime;
- bias-corrected (the mean of the samples seen so far, not a pull from 1.0): the
  first iterations on a slow machine are charged right, not 10 iterations later;
- each sample's ratio clamped to [1/100, 1000]: a clock glitch or a sleeping laptop
  cannot make the scale absurd; beyond 1000x slower the profile is simply wrong;
- non-finite or non-positive times are ignored (a step whose time says nothing).

Before any sample the scale is exactly 1.0, so the simulator (which never observes)
charges exactly the profile's predictions, bit for bit.
"""

from __future__ import annotations

import math

WEIGHT = 0.1  # each new iteration's share of the estimate (about the last 10 count)
MIN_RATIO = 0.01  # clamp of one sample's measured / predicted
MAX_RATIO = 1000.0


class LiveCost:
    """An EWMA of measured / predicted iteration time; `scale` multiplies predictions."""

    def __init__(
        self, weight: float = WEIGHT, min_ratio: float = MIN_RATIO, max_ratio: float = MAX_RATIO
    ) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        if not 0.0 < min_ratio <= 1.0 <= max_ratio < math.inf:
            raise ValueError(f"need 0 < min_ratio <= 1 <= max_ratio, got {min_ratio}, {max_ratio}")
        self.weight = weight
        self._log_lo, self._log_hi = math.log(min_ratio), math.log(max_ratio)
        self._mean = 0.0  # EWMA of log ratio, started at 0 (bias-corrected in `scale`)
        self._mass = 0.0  # 1 - (1 - weight) ** samples: the weight the samples hold
        self._scale = 1.0
        self.samples = 0
        self.last_ratio: float | None = None  # the latest sample's ratio, unclamped

    @property
    def scale(self) -> float:
        """Measured / predicted iteration time (1.0 until an iteration was observed)."""
        return self._scale

    def observe(self, predicted_s: float, measured_s: float) -> bool:
        """One iteration: what the cost model predicted and how long it took.

        Returns False (and changes nothing) for a sample that says nothing.
        """
        if not (0.0 < predicted_s < math.inf and 0.0 < measured_s < math.inf):
            return False  # (NaN fails both comparisons)
        ratio = measured_s / predicted_s
        if not 0.0 < ratio < math.inf:  # an overflow or underflow of the division
            return False
        self.last_ratio = ratio
        x = min(max(math.log(ratio), self._log_lo), self._log_hi)
        w = self.weight
        self._mean += w * (x - self._mean)
        self._mass += w * (1.0 - self._mass)
        self._scale = math.exp(self._mean / self._mass)
        self.samples += 1
        return True

    def reset(self) -> None:
        """Forget every sample (the scale is 1.0 again)."""
        self._mean = self._mass = 0.0
        self._scale = 1.0
        self.samples = 0
        self.last_ratio = None
