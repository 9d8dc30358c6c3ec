"""What the twin learns from the last minutes of serving: arrivals, lengths, iteration time.

The engine records every arrival and every finished job, and the daemon's loop every
iteration's wall time; a preview (fsd.twin) fits its models to these (pure numpy, no
torch: the twin's process imports this module and nothing else of the engine):

- arrivals: a renewal process of the observed rate (arrivals in the window / the
  window) and inter-arrival CV (1 = Poisson, above = bursty). Rate and CV are the
  two moments a GI/G/1 queue's waiting time depends on (Kingman's formula: the wait
  grows with (ca^2 + cs^2) / 2), so they are what a burstier minute changes.
- lengths: (prompt, output) pairs of recently finished jobs, resampled jointly
  (prompt and output lengths are correlated in real traces; a fitted pair of
  marginals would lose that).
- the clock: wall seconds between the starts of back-to-back iterations against
  the profile's prediction for the batch, fitted as wall = scale x predicted +
  overhead by least squares. The overhead is the loop's fixed cost per iteration
  (scheduling, sampling, streaming, telemetry), which a pure ratio would charge
  to large batches and deny small ones.

Memory: each record is a `Ring`, a fixed block allocated at start that the latest
rows overwrite, so the history takes the same memory after its first job as after
millions (about 130 KB in all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fsd.jobs import FinishReason, Job

ARRIVAL_WINDOW = 300.0  # seconds of arrivals a fit reads at most
MAX_ARRIVALS = 8192
MAX_FINISHED = 2048
MAX_STEPS = 1024
MIN_CLOCK_SAMPLES = 8  # iterations before the clock is fitted (else the profile, x1)
OUTLIER = 5.0  # an iteration over 5x the median wall/predicted ratio is not the regime


@dataclass(frozen=True)
class ArrivalFit:
    """The arrival process a preview draws from: rate 0 means none are assumed."""

    rate: float
    cv: float
    window: float  # seconds of history read
    seen: int  # arrivals in it


@dataclass(frozen=True)
class Clock:
    """An iteration's wall time: `scale` x the profile's prediction + `overhead` s."""

    scale: float = 1.0
    overhead: float = 0.0
    samples: int = 0

    def __call__(self, predicted: float) -> float:
        return self.scale * predicted + self.overhead


class Ring:
    """The latest `cap` rows of numbers, in an array allocated once (oldest overwritten).

    A row is appended as a tuple and read back as one, each value through `columns`
    (its Python type); `array()` gives the rows held, oldest first."""

    def __init__(self, cap: int, columns: Sequence[Callable[[Any], Any]]) -> None:
        self.cap = cap
        self._columns = tuple(columns)
        self._data = np.zeros((cap, len(self._columns)))
        self._count = 0  # rows appended in all

    def append(self, row: Sequence[float]) -> None:
        self._data[self._count % self.cap] = row
        self._count += 1

    def __len__(self) -> int:
        return min(self._count, self.cap)

    def array(self) -> np.ndarray:
        """The rows held, oldest first (a copy)."""
        if self._count <= self.cap:
            return self._data[: self._count].copy()
        return np.roll(self._data, -(self._count % self.cap), axis=0)

    def __iter__(self) -> Iterator[tuple]:
        columns = self._columns
        for row in self.array().tolist():
            yield tuple(kind(v) for kind, v in zip(columns, row, strict=True))


class WorkHistory:
    """Bounded records of recent arrivals, finished jobs and iterations (module doc)."""

    def __init__(self, now: float) -> None:
        self.started = now
        self.arrivals = Ring(MAX_ARRIVALS, (float,))  # (time,)
        self.finished = Ring(MAX_FINISHED, (int, int, bool))  # (prompt, output, natural)
        self.steps = Ring(MAX_STEPS, (float, float))  # (predicted, wall)
        self._chain: tuple[float, float] | None = None  # last busy step: start, predicted

    # ---- recording (cheap: the engine thread calls these) -----------------------

    def arrived(self, t: float) -> None:
        self.arrivals.append((t,))

    def ended(self, job: Job) -> None:
        """A job left the engine: its lengths count if it finished (not aborted or
        failed); `natural`: it stopped by itself (EOS or a stop), not at its limit."""
        reason = job.finish_reason
        if reason is FinishReason.STOP or reason is FinishReason.LENGTH:
            natural = reason is FinishReason.STOP
            self.finished.append((job.num_prompt_tokens, job.num_output_tokens, natural))

    def stepped(self, start: float, end: float, predicted: float, ran: bool, busy: bool) -> None:
        """The loop stepped from `start` to `end`; `ran`: a batch ran (predicted at
        `predicted` s); `busy`: jobs remain, so the next step follows at once."""
        if self._chain is not None:  # the previous step's wall: until this one started
            prev_start, prev_pred = self._chain
            self.steps.append((prev_pred, start - prev_start))
            self._chain = None
        if not ran or predicted <= 0:
            return
        if busy:
            self._chain = (start, predicted)
        else:  # idle next: its own duration is all we know
            self.steps.append((predicted, end - start))

    # ---- fitting (the preview's, on the engine thread at the snapshot) ----------

    def arrival_fit(self, now: float, window: float = ARRIVAL_WINDOW) -> ArrivalFit:
        span = min(window, max(now - self.started, 0.0))
        times = self.arrivals.array()[:, 0]
        times = times[(times >= now - span) & (times <= now)]
        if times.size >= 2 and span < window:  # a young daemon: from its first arrival
            span, n = now - float(times.min()), times.size - 1
        else:
            n = times.size
        if n < 2 or span <= 0:
            return ArrivalFit(0.0, 1.0, span, int(times.size))
        rate = n / span
        gaps = np.diff(np.sort(times))
        cv = float(gaps.std() / gaps.mean()) if gaps.size >= 3 and gaps.mean() > 0 else 1.0
        return ArrivalFit(float(rate), cv, span, int(times.size))

    def clock(self) -> Clock:
        if len(self.steps) < MIN_CLOCK_SAMPLES:
            return Clock(samples=len(self.steps))
        pred, wall = self.steps.array().T
        ratio = wall / pred
        keep = ratio <= OUTLIER * np.median(ratio)
        pred, wall = pred[keep], wall[keep]
        n = int(pred.size)
        if n >= MIN_CLOCK_SAMPLES and np.ptp(pred) > 0.05 * pred.mean():
            scale, overhead = np.polyfit(pred, wall, 1)
            if scale > 0 and overhead >= 0:
                return Clock(float(scale), float(overhead), n)
        return Clock(float(wall.sum() / pred.sum()), 0.0, n)  # one ratio: no spread to fit

    def lengths(self) -> list[tuple[int, int, bool]]:
        return list(self.finished)
