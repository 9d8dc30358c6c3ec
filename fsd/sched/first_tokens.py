"""How long a job that arrives now will wait for its first token, from what was measured.

Design. Past capacity the wait is set by how fast jobs start (a batch slot or KV room
frees when a long job ends), not by quanta: ENST assumes time slicing and predicts a
new job near zero while a thousand wait. What is measured needs no model: the jobs
that have not produced a first token yet, times the seconds per start over the last
`window` (its latest MAX_STARTS starts at most; Little's law for the queue before the
first token). Only backlogged seconds count (some job waiting for its first token):
below capacity jobs start as fast as they arrive, and that rate says nothing of how
fast they could. The walk lets a prompt that fits the room pass one that does not,
so the count can look short while a long prompt taken long ago still waits: no new
job is predicted a shorter wait than the oldest waiting job's so far (a promise
already late). With too few starts in the window nothing is predicted (nothing is
refused).
"""

from __future__ import annotations

from collections import deque

from fsd.jobs import Job

RATE_WINDOW_S = 60.0  # the starts a rate is measured over: a minute of them
MIN_STARTS = 8  # fewer starts in the window than this: no prediction
MAX_STARTS = 256  # and the latest this many at most (bounded memory at any rate)


class FirstTokenWait:
    """The jobs still waiting for a first token, and when recent ones got theirs."""

    def __init__(self, window: float = RATE_WINDOW_S) -> None:
        self.window = window
        # live jobs without a first token: id -> arrival, oldest first (arrival order)
        self.waiting: dict[str, float] = {}
        # (time, backlogged seconds by then) of the latest starts within the window
        self.starts: deque[tuple[float, float]] = deque(maxlen=MAX_STARTS)
        self.backlog_s = 0.0  # seconds with some job waiting, up to `clock`
        self.clock = 0.0  # the latest event's time (nothing waits before the first)

    def arrived(self, job: Job, now: float) -> None:
        # (a job that comes with tokens, e.g. migrated, counts as started at its next step)
        self._tick(now)
        self.waiting[job.job_id] = job.arrival_time

    def ran(self, job: Job, now: float) -> None:
        """`job` was in a batch that ended at `now`: was that its first token?"""
        if job.first_token_time is not None and job.job_id in self.waiting:
            self._tick(now)
            del self.waiting[job.job_id]
            self.starts.append((now, self.backlog_s))  # (maxlen: the oldest drops)
            self._trim(now)  # the window ends at the latest start, whatever asks later

    def left(self, job: Job) -> None:
        self.waiting.pop(job.job_id, None)

    def predicted(self, job: Job, now: float) -> float | None:
        """Seconds `job` (just arrived) is predicted to wait for its first token: the
        jobs waiting before it times the backlogged seconds per start; None: too few
        starts in the window."""
        starts = self._trim(now)
        if len(starts) < MIN_STARTS:
            return None
        backlog = self.backlog_s + (max(now - self.clock, 0.0) if self.waiting else 0.0)
        # backlogged seconds since the first start kept, over the starts after it
        per_start = (backlog - starts[0][1]) / (len(starts) - 1)
        ahead = len(self.waiting) - (job.job_id in self.waiting)
        # the oldest job still waiting (not `job` itself): a promise already late
        oldest_id, oldest = next(iter(self.waiting.items()), (job.job_id, now))
        late = 0.0 if oldest_id == job.job_id else now - oldest
        return max(ahead * per_start, late)

    def _tick(self, now: float) -> None:
        """Time moves to `now` (never back): backlogged while some job waits."""
        step = max(now - self.clock, 0.0)
        self.backlog_s += step if self.waiting else 0.0
        self.clock += step

    def _trim(self, now: float) -> deque[tuple[float, float]]:
        starts = self.starts
        while starts and starts[0][0] < now - self.window:
            starts.popleft()
        return starts
