"""Fair sharing between owners inside each level: start-time fair queuing by job count.

Why: FIFO inside a level lets one client's backlog push everyone else's jobs to the
back: a client holding 90,000 jobs at Q1 put another's 2-token job behind all of them
(202 s of waiting, issue P21). Each job is stamped with a round when it is placed at a
level: its owner's last round there + 1, or the level's virtual time when that is
later (an owner idle at the level starts at the level's present, not at its past).
A level is ordered by (round, queue_seq), so owners take turns job by job, and a
newcomer's first job goes just behind the jobs running now. The virtual time is the
latest round that ran at the level. One owner (all jobs of one client, the simulator,
the offline API) gets rounds that grow with queue_seq: exactly the FIFO it had.

The rounds decide the order between jobs of one level only; levels, quanta,
promotion and demotion stay the policy's. Owners are opaque names (`Job.owner`; the
daemon's is the caller's identity, fsd.server.admission); None is one owner.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterable

from fsd.jobs import Job

fair_key = operator.attrgetter("fair_round", "queue_seq")  # a level's order
_COMPACT_MIN = 64  # late jobs a level may hold before it is rebuilt in order


def level_order(jobs: dict[str, Job], late: dict[str, Job] | None) -> Iterable[Job]:
    """A level's jobs in turn order. `jobs` is in order but for its suffix `late` (the
    jobs placed since one came out of order): each late job is bisected into the rest,
    so a flood's level of 100,000 jobs costs one copy, not a sort."""
    if not late:
        return jobs.values()
    main = list(itertools.islice(jobs.values(), len(jobs) - len(late)))
    parts: list[Iterable[Job]] = []
    start = 0
    for job in sorted(late.values(), key=fair_key):
        at = bisect.bisect_right(main, fair_key(job), lo=start, key=fair_key)
        parts.append(main[start:at])
        parts.append((job,))
        start = at
    parts.append(main[start:])
    return itertools.chain.from_iterable(parts)


def needs_compacting(jobs: dict[str, Job], late: dict[str, Job]) -> bool:
    """Whether a level's late jobs are many enough to rebuild it in order: at most
    1/64 of the level (or 64), so rebuilding costs O(64) per placement over time."""
    return len(late) > max(_COMPACT_MIN, len(jobs) >> 6)


class OwnerRounds:
    """Each level's virtual time and each owner's last round there (module doc).

    `place` stamps a job entering a level and says whether it went behind the level's
    last job (the level's dict, in insertion order, is still sorted) or not (the
    caller re-sorts the level before reading its order); `leave` forgets it; `ran`
    moves the level's virtual time on.
    """

    def __init__(self, levels: int) -> None:
        self._vtime = [0] * levels
        self._tails: list[dict[str | None, list[int]]] = [{} for _ in range(levels)]

    def resize(self, levels: list[dict[str, Job]]) -> None:
        """Rebuild from the jobs each level holds (the number of levels changed)."""
        self._vtime = [0] * len(levels)
        self._tails = [{} for _ in levels]
        for level, jobs in enumerate(levels):
            for job in jobs.values():
                self._count(level, job)
            self._vtime[level] = min((j.fair_round for j in jobs.values()), default=0)

    def place(self, level: int, job: Job, jobs: dict[str, Job]) -> bool:
        """Stamp `job` (not yet in `jobs`, the level's dict) with its round; True if it
        sorts after every job the level holds."""
        tail = self._tails[level].get(job.owner)
        now = self._vtime[level]
        job.fair_round = now if tail is None else max(now, tail[0] + 1)
        self._count(level, job)
        if not jobs:
            return True
        last = next(reversed(jobs.values()))
        return fair_key(last) <= fair_key(job)

    def _count(self, level: int, job: Job) -> None:
        tails = self._tails[level]
        tail = tails.get(job.owner)
        if tail is None:
            tails[job.owner] = [job.fair_round, 1]
        else:
            tail[0] = max(tail[0], job.fair_round)
            tail[1] += 1

    def leave(self, level: int, job: Job) -> None:
        """`job` left `level` (it moved, finished or was aborted)."""
        tails = self._tails[level]
        tail = tails.get(job.owner)
        if tail is None:
            return
        tail[1] -= 1
        if tail[1] <= 0:
            del tails[job.owner]

    def ran(self, level: int, job: Job) -> None:
        """`job` ran at `level`: the level's present is at least its round."""
        if job.fair_round > self._vtime[level]:
            self._vtime[level] = job.fair_round

    def owners(self, level: int) -> int:
        """How many owners hold jobs at `level`."""
        return len(self._tails[level])
