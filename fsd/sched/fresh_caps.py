"""The gittins demote rule's cold start: before output lengths are learned, a job
keeps its level while its cap is below the shortest cap of a job waiting to start
(fsd.sched.lengths, "Cold start"). Those caps are found in one walk of the queue,
kept until a job waiting to start arrives or leaves or a job may have made its first
token: a walk per iteration would be linear in a flood."""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Iterator

from fsd.jobs import Job
from fsd.sched.lengths import OutputLengthIndex

_cap = operator.attrgetter("params.max_tokens")


class FreshCaps:
    """The smallest max_tokens of a job waiting to start, its job, and the next
    smallest (0: none), so each job's comparison leaves itself out. Tied smallest caps
    need no holder: the next smallest is the same cap."""

    def __init__(self, waiting: Callable[[], Iterator[Job]]) -> None:
        self._waiting = waiting  # the queued jobs without a token, in the queue's order
        self._kept: tuple[int, Job | None, int] | None = None

    def stale(self) -> None:
        self._kept = None

    def shortest_other(self, job: Job) -> int:
        """The smallest cap of a job waiting to start other than `job`."""
        if self._kept is None:
            self._kept = self._walk()
        best, holder, second = self._kept
        return second if job is holder else best

    def _walk(self) -> tuple[int, Job | None, int]:
        caps = Counter(map(_cap, self._waiting()))
        if not caps:
            return (0, None, 0)
        best = min(caps)
        if caps[best] > 1:
            return (best, None, best)
        holder = min(self._waiting(), key=_cap)  # the one job of that cap
        return (best, holder, min((c for c in caps if c != best), default=0))


def keeps_level(lengths: OutputLengthIndex, job: Job, fresh: FreshCaps) -> bool:
    """The gittins demote rule: `job`, its quantum spent, keeps its level."""
    if lengths.ready:
        return lengths.keeps_level(job.num_output_tokens)
    return lengths.keeps_level(
        job.num_output_tokens, job.params.max_tokens, fresh.shortest_other(job)
    )
