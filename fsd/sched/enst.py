"""ENST over MLFQ levels (paper §4.2): the estimate the proactive swapper ranks by.

Split from fsd.sched.mlfq so the level bookkeeping and the estimate each stay small;
`LevelENST` reads only the queue's levels, quanta and promotion clock.
"""

from __future__ import annotations

import heapq
import itertools
from abc import abstractmethod
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from typing import Any

from fsd.jobs import Job
from fsd.sched.fair_share import fair_key
from fsd.sched.queues import JobQueue

Fn = Callable[[Job], float]  # ENST of a job
Ranked = Iterator[tuple[float, Job]]  # (ENST, job), largest first


class LevelENST(JobQueue):
    """ENST for a queue of levels: `_levels` (dicts by job id, highest first),
    `quanta` and `_due(job)` (when a job is next promoted) come from the subclass."""

    _levels: list[dict[str, Job]]
    quanta: list[float]
    _t_exec: list[float] | None = None

    @abstractmethod
    def _due(self, job: Job) -> float:
        """When `job` is next promoted (the subclass's starvation rule; inf: never)."""

    def level_backlog(self, job: Job, batch_size: int) -> float:
        """Seconds the jobs queued at `job`'s own level ahead of it take before it runs,
        each up to the level's quantum (ENST counts only the levels above)."""
        level = min(max(job.level, 0), len(self._levels) - 1)
        mine = fair_key(job)  # a level's order (FIFO, or owners' turns)
        ahead = sum(1 for j in self._levels[level].values() if fair_key(j) < mine)
        return ahead * self.quanta[level] / max(batch_size, 1)

    def largest_enst_first(self, jobs: Iterable[Job], chosen: Container[str], enst: Fn) -> Ranked:
        """Largest ENST first, reading the levels lazily.

        ENST(i) <= T_execute(level(i)), which grows with the level, so each level's
        bound is a marker in a max-heap and a level's jobs are read only when its
        bound reaches the top. The planner usually needs a few victims from the
        lowest levels, so most jobs are never looked at. `jobs` (the device-resident
        candidates) are grouped by level in queue order first: the levels themselves
        also hold every waiting job, thousands under overload. Uses the T_execute
        table of the latest `enst_fn` (the one `enst` comes from).
        """
        t_exec = getattr(self, "_t_exec", None)
        levels = self._levels
        if t_exec is None or len(t_exec) != len(levels):
            yield from super().largest_enst_first(
                (j for j in jobs if j.job_id in chosen), chosen, enst
            )
            return
        at: dict[int, list[Job]] = {}
        n = len(levels)
        for job in jobs:
            level = job.level
            if 0 <= level < n and job.job_id in levels[level] and job.job_id in chosen:
                at.setdefault(level, []).append(job)
        seq = itertools.count()
        # (-value, kind, seq, item): kind 0 = a level's bound, read before equal jobs
        heap: list[tuple[float, int, int, Any]] = [
            (-t_exec[lvl], 0, next(seq), lvl) for lvl in sorted(at)
        ]
        heapq.heapify(heap)
        while heap:
            neg, kind, _, item = heapq.heappop(heap)
            if kind == 1:
                yield -neg, item
                continue
            # Most jobs of a level sit exactly at its bound (promotion is far off), and
            # nothing left in the heap exceeds that bound: yield those at once, as far as
            # the planner reads, and queue only the jobs promoted sooner.
            bound = -neg
            for job in sorted(at[item], key=fair_key):
                e = enst(job)
                if e >= bound:
                    yield e, job
                else:
                    heapq.heappush(heap, (-e, 1, next(seq), job))

    def enst_fn(
        self, now: float, batch_size: int, pending: Sequence[tuple[Job, float]] = ()
    ) -> Callable[[Job], float]:
        """ENST(i) = min(T_promote(i), T_execute(i)) (paper §4.2).

        T_execute(i) = (1/B) Σ_{j above i} Σ_{k = level(j)}^{level(i)-1} q_k assumes each
        job above i runs down to i's level before i runs. With c_l jobs at level l and
        P[l] = Σ_{k<l} q_k it is (1/B) Σ_{l<L} c_l (P[L] - P[l]): O(levels) to prepare,
        O(1) per job, so it is evaluated only for the jobs a decision needs.
        A partly prefilled job above i (`pending`: chunked prefill) also has the rest
        of its prefill to run first, which no quantum counts (prefill is not charged
        at the skip-join level): it is added to every level below its own.
        """
        prefix = [0.0]
        for q in self.quanta:
            prefix.append(prefix[-1] + q)
        b = max(batch_size, 1)
        extra = [0.0] * len(self._levels)  # pending prefill seconds at each level
        for job, seconds in pending:
            extra[min(max(job.level, 0), len(extra) - 1)] += seconds
        t_exec: list[float] = []
        count = weighted = above = 0.0
        for lvl, jobs in enumerate(self._levels):
            t_exec.append((prefix[lvl] * count - weighted + above) / b)
            count += len(jobs)
            weighted += len(jobs) * prefix[lvl]
            above += extra[lvl]
        due = self._due
        self._t_exec = t_exec

        def enst(job: Job) -> float:
            level = min(max(job.level, 0), len(t_exec) - 1)
            return min(max(0.0, due(job) - now), t_exec[level])

        return enst
