"""What the batch walk looks up instead of walking the whole queue: each owner's latest
live job and how many live jobs each owner has (for owners' leads), and the jobs
without KV by size (which of them a room could take)."""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping

from fsd.jobs import Job
from fsd.kv.block_manager import BlockManager

# a narrowed walk's set (C, per job in it) pays against a walk (Python, per job walked
# past) while it holds under 1/NARROW_SHARE of the queue
NARROW_SHARE = 2


class WaitingIndex:
    """The live jobs' owners, and the jobs without KV sorted by size (tokens), kept as
    jobs come and leave (`add`, `remove`), start (`started`) and lose their KV (`dropped`);
    `live` is the scheduler's own map.

    Under overload thousands of prompts wait and few could fit the room: `below` cuts
    the sorted list where the room ends, without looking at the rest."""

    def __init__(self, live: Mapping[str, Job]) -> None:
        self.live = live
        self.newest: dict[str | None, Job] = {}  # each owner's latest live job
        self.owners: Counter[str | None] = Counter()  # live jobs per owner
        self._keys: list[tuple[int, int]] = []  # (tokens, seq) of each job without KV
        self._jobs: list[Job] = []  # the same jobs, in the same order
        self._key_of: dict[str, tuple[int, int]] = {}
        self._seq = itertools.count()

    def add(self, job: Job) -> None:
        """A new live job (without KV)."""
        self.newest[job.owner] = job
        self.owners[job.owner] += 1
        self._insert(job)

    def remove(self, job: Job) -> None:
        """A live job left."""
        if self.newest.get(job.owner) is job:
            del self.newest[job.owner]
        self.owners[job.owner] -= 1
        if self.owners[job.owner] <= 0:
            del self.owners[job.owner]
        self._delete(job)

    def started(self, jobs: Iterable[Job]) -> None:
        """Jobs without KV that got it."""
        for job in jobs:
            self._delete(job)

    def dropped(self, jobs: Iterable[Job]) -> None:
        """Jobs whose KV was dropped: they wait again, perhaps larger than they came."""
        for job in jobs:
            self._delete(job)
            self._insert(job)

    def below(self, tokens: float, at_most: int) -> list[Job] | None:
        """The jobs without KV of fewer than `tokens` tokens; None if over `at_most`."""
        n = bisect.bisect_left(self._keys, (tokens,))
        return self._jobs[:n] if n <= at_most else None

    def _insert(self, job: Job) -> None:
        key = self._key_of[job.job_id] = (job.num_tokens, next(self._seq))
        at = bisect.bisect_left(self._keys, key)
        self._keys.insert(at, key)
        self._jobs.insert(at, job)

    def _delete(self, job: Job) -> None:
        key = self._key_of.pop(job.job_id, None)
        if key is not None:
            at = bisect.bisect_left(self._keys, key)
            del self._keys[at], self._jobs[at]


def could_run(
    blocks: BlockManager, dropped: Iterable[Job], waiting: WaitingIndex, room_tokens: float
) -> set[Job] | None:
    """Every job a walk that lets no job pass the room may still consider: the started
    ones, those whose KV it dropped, and the jobs without KV under `room_tokens`. None
    unless they are under 1/NARROW_SHARE of the queued jobs: the set costs more."""
    started = len(blocks.on_device) + len(blocks.on_host) + len(blocks.moving)
    fits = waiting.below(room_tokens, (len(waiting.live) - 1) // NARROW_SHARE - started)
    if fits is None:
        return None
    jobs: set[Job] = set(fits)
    jobs.update(blocks.on_device.values())  # type: ignore[arg-type]
    jobs.update(blocks.on_host.values())  # type: ignore[arg-type]
    jobs.update(op.job for op in blocks.moving.values())  # type: ignore[misc]
    jobs.update(dropped)
    return jobs
