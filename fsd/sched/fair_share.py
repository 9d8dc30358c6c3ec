"""Fair sharing between owners inside each level: start-time fair queuing by job count.

Why: FIFO inside a level lets one client's backlog push everyone else's jobs to the
back, behind all of its own (docs/history.md). Each job is stamped with a round when it is placed at a
level: its owner's last round there + 1, or the level's virtual time when that is
later (an owner idle at the level starts at the level's present, not at its past).
A level is ordered by (round, queue_seq), so owners take turns job by job, and a
newcomer's first job goes just behind the jobs running now. The virtual time is the
latest round that ran at the level. One owner (all jobs of one client, the simulator,
the offline API) gets rounds that grow with queue_seq: exactly the FIFO it had.

The rounds decide the order between jobs of one level only; levels, quanta,
promotion and demotion stay the policy's. Owners are opaque names (`Job.owner`; the
daemon's is the caller's identity, fsd.server.loop.job_admission); None is one owner.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterable

from fsd.jobs import Job

fair_key = operator.attrgetter("fair_round", "queue_seq")  # a level's order


class TurnOrder:
    """One level's jobs grouped by round: the level's order is its rounds ascending, and
    inside a round the order of placement (queue_seq grows with every placement).

    Why groups: placements arrive out of round order whenever owners send at different
    paces (a flood's connection ahead of another's), and a level kept as one ordered
    dict had to be rebuilt, linear in the level, every 1/64 of it. Here a
    placement is a dict insert (a new round: usually an append to `rounds`), leaving
    is a pop, and the order is read with C-level iterators."""

    def __init__(self) -> None:
        self.groups: dict[int, dict[str, Job]] = {}
        self.rounds: list[int] = []  # ascending

    def add(self, job: Job) -> None:
        r = job.fair_round
        group = self.groups.get(r)
        if group is not None:
            group[job.job_id] = job
            return
        self.groups[r] = {job.job_id: job}
        rounds = self.rounds
        if not rounds or rounds[-1] < r:
            rounds.append(r)
        else:
            bisect.insort(rounds, r)

    def remove(self, job: Job) -> None:
        r = job.fair_round
        group = self.groups.get(r)
        if group is None or group.pop(job.job_id, None) is None or group:
            return
        del self.groups[r]
        rounds = self.rounds
        i = bisect.bisect_left(rounds, r)
        if i < len(rounds) and rounds[i] == r:
            del rounds[i]

    def jobs(self) -> Iterable[Job]:
        """The level's jobs in turn order (lazily: a walk that stops early is cheap)."""
        return itertools.chain.from_iterable(
            map(dict.values, map(self.groups.__getitem__, self.rounds))
        )


class OwnerRounds:
    """Each level's virtual time and each owner's last round there (module doc).

    `place` stamps a job entering a level; `leave` forgets it; `ran` moves the level's
    virtual time on. Each owner's jobs at a level get growing rounds, so with one owner
    the placement order is the turn order.
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

    def place(self, level: int, job: Job) -> None:
        """Stamp `job`, entering `level`, with its round."""
        tail = self._tails[level].get(job.owner)
        now = self._vtime[level]
        job.fair_round = now if tail is None else max(now, tail[0] + 1)
        self._count(level, job)

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
