"""The level-queue base of the policy family: levels, FIFO inside a level, the entry
level, the last batch's lifts, and ENST over the levels (`LevelENST`).

Two policies stand on it as siblings, each adding only its own rules: the paper's
MLFQ family (`fsd.sched.mlfq`: starvation timers, demotion at a quantum's end) and the
Gittins-ranked queue (`fsd.study.gittins_queue`: levels by rank, the FCFS-turn guard).
A job's place is (level, queue_seq): `_place` puts it at a level's tail with a fresh
quantum. Hooks: `_watch` (a starvation clock, none here), `_due` (when the job is next
promoted: never here) and `_lifts` / `_lifted_level` (the rank of a job of the last
batch, `set_running`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence

from fsd.cost import CostModel
from fsd.jobs import Job, KVLocation
from fsd.sched.enst import LevelENST
from fsd.sched.fair_share import OwnerRounds, TurnOrder, fair_key
from fsd.sched.queues import LevelView

_by_queue_seq = operator.attrgetter("queue_seq")
_job_id = operator.attrgetter("job_id")
# a lazy heap (`_pruned`) holds at most twice the queued jobs plus this many entries
HEAP_SLACK = 64
HeapEntry = tuple[float, int, Job]  # (when, seq, job): a timer of a policy's lazy heap


def entry_level(quanta: Sequence[float], iteration_time: float) -> int:
    """The highest level whose quantum covers `iteration_time` (the last if none):
    skip-join's rule, which a router applies to a replica's quanta too. Quanta strictly
    increase (SchedConfig checks): a bisection finds it."""
    if iteration_time != iteration_time:  # NaN: covered by none
        return len(quanta) - 1
    return min(bisect.bisect_left(quanta, iteration_time), len(quanta) - 1)


class LevelQueue(LevelENST):
    """Levels Q1..Qn with quanta q1 < q2 < ..., FIFO inside a level; with `fair`, owners
    take turns inside a level (fsd.sched.fair_share), which is FIFO for one owner."""

    fair = False

    def __init__(self, cost: CostModel, quanta: Sequence[float]) -> None:
        super().__init__(cost)
        self.quanta = list(quanta)
        self._levels: list[dict[str, Job]] = [{} for _ in self.quanta]
        self._rounds = OwnerRounds(len(self.quanta))
        self._turns = [TurnOrder() for _ in self.quanta]  # each level's order (fair only)
        self._lifted: dict[str, int] = {}  # a job of the last batch -> the level it ranks at
        self._lifted_at: dict[int, list[Job]] = {}

    # ---- membership ------------------------------------------------------------

    def entry_level(self, iteration_time: float) -> int:
        """The highest level whose quantum covers `iteration_time` (the last if none)."""
        return entry_level(self.quanta, iteration_time)

    def _unlink(self, job: Job) -> None:
        level = job.level
        if not 0 <= level < len(self._levels):
            return
        if self._levels[level].pop(job.job_id, None) is not None and self.fair:
            self._rounds.leave(level, job)
            self._turns[level].remove(job)

    def _place(self, job: Job, level: int) -> None:
        """Put the job at the tail of `level` (its owner's turn there, with `fair`)
        with a fresh quantum."""
        self._unlink(job)
        job.level = level
        job.attained = 0.0
        job.queue_seq = next(self._seq)
        if self.fair:
            self._rounds.place(level, job)
            self._turns[level].add(job)
        self._levels[level][job.job_id] = job
        self._watch(job)

    def _level_jobs(self, level: int) -> Iterable[Job]:
        """One level's jobs in order: FIFO, or owners' turns with `fair` (with one
        owner at the level its placement order, the plain dict's)."""
        if not self.fair or self._rounds.owners(level) <= 1:
            return self._levels[level].values()
        return self._turns[level].jobs()

    def _regroup(self) -> None:
        """Rebuild the turns from the levels' dicts (each in turn order)."""
        self._rounds.resize(self._levels)
        self._turns = [TurnOrder() for _ in self._levels]
        for turns, jobs in zip(self._turns, self._levels, strict=True):
            for job in jobs.values():
                turns.add(job)

    def _watch(self, job: Job) -> None:
        """A placement's hook: the policy's starvation clock (none here)."""

    def _pruned(
        self, heap: list[HeapEntry], current: Callable[[HeapEntry], bool]
    ) -> list[HeapEntry]:
        """A lazy heap (its stale entries are skipped when popped) without the stale
        entries once they could outnumber the queued jobs, or the queue is empty: so it
        holds at most 2x the queue plus HEAP_SLACK entries, and none once every job left
        (a job that ended before its timer came due would be held until it did)."""
        n = len(self)
        if not heap or (n and len(heap) <= 2 * n + HEAP_SLACK):
            return heap
        kept = [e for e in heap if current(e)]
        heapq.heapify(kept)
        return kept

    def _due(self, job: Job) -> float:
        """When the job is promoted unless it runs first (never here)."""
        return math.inf

    def __len__(self) -> int:
        return sum(len(lvl) for lvl in self._levels)

    def ordered(self) -> Iterator[Job]:
        if not self._lifted:
            if self.fair:
                return itertools.chain.from_iterable(map(self._level_jobs, range(len(self._levels))))
            return itertools.chain.from_iterable(lvl.values() for lvl in self._levels)
        return self._ordered_lifted()

    def heads(self, n: int) -> Iterable[Job]:
        return itertools.chain.from_iterable(
            itertools.islice(self._level_jobs(i), n) for i in range(len(self._levels))
        )

    def _ordered_lifted(self) -> Iterator[Job]:
        """Each level: the lifted jobs ranked at it, then its own jobs that are not lifted.

        Built from C-level iterators (the walk reads it every iteration): only the
        levels that hold a lifted job are filtered, by id, and the few lifted jobs are
        checked once for still being queued."""
        lifted, lifted_at, levels = self._lifted, self._lifted_at, self._levels
        # (a lifted job's level is a level: set_running checked it, and only `adopt`,
        # which clears the lifts, removes levels)
        still = [j for group in lifted_at.values() for j in group if j.job_id in levels[j.level]]
        queued = {j.job_id for j in still}
        holding = {j.level for j in still}  # the levels whose own jobs include lifted ones
        parts: list[Iterable[Job]] = []
        for level, jobs in enumerate(levels):
            group = lifted_at.get(level)
            if group:
                parts.append([job for job in group if job.job_id in queued])
            own = self._level_jobs(level)
            if level in holding:
                ids = itertools.filterfalse(lifted.__contains__, map(_job_id, own))
                parts.append(map(jobs.__getitem__, ids))
            else:
                parts.append(own)
        return itertools.chain.from_iterable(parts)

    def key(self, job: Job) -> tuple:
        at = self._lifted.get(job.job_id)
        return (job.level, 1, *fair_key(job)) if at is None else (at, 0, job.queue_seq)

    def set_running(self, jobs: Iterable[Job]) -> None:
        """Preemption threshold: rank the last batch's jobs `preempt_threshold` levels up.

        Why: ranks are coarse (a level is a factor of 2 in attained service), and a job
        one level above a running one is not clearly shorter; evicting for it costs a
        swap out and back. Lifting the running jobs means a waiting job preempts them
        only when it is far ahead, the classic preemption-threshold rule.
        """
        self._lifted, self._lifted_at = lifted, lifted_at = {}, {}
        if not self._lifts():
            return
        levels = self._levels
        n = len(levels)
        for job in jobs:
            level = job.level
            if 0 < level < n and job.job_id in levels[level]:
                at = self._lifted_level(job)
                if at >= level:
                    continue
                lifted[job.job_id] = at
                group = lifted_at.get(at)
                if group is None:
                    lifted_at[at] = [job]
                else:
                    group.append(job)
        for group in lifted_at.values():
            if len(group) > 1:
                group.sort(key=_by_queue_seq)

    def _lifts(self) -> bool:  # whether `set_running` lifts anything
        return False

    def _lifted_level(self, job: Job) -> int:
        """The level a job of the last batch ranks at (its own here)."""
        return job.level

    def __contains__(self, job: Job) -> bool:
        return 0 <= job.level < len(self._levels) and job.job_id in self._levels[job.level]

    # ---- views -----------------------------------------------------------------

    def levels(self) -> list[LevelView]:
        return [
            LevelView(i, q, tuple(j.job_id for j in self._level_jobs(i)))
            for i, q in enumerate(self.quanta)
        ]

    def limits(self) -> tuple[list[float], float | None, float | None]:
        return list(self.quanta), None, None

    def new_jobs_in_top_levels(self, k: int, cap: int) -> int:
        count = 0
        for lvl in self._levels[:k]:
            for job in lvl.values():
                if job.kv is KVLocation.NONE:
                    count += 1
                    if count >= cap:
                        return count
        return count
