"""The sorted queues: FCFS, fixed priority by prompt length (the paper's first
strawman, kept for study) and SRPT (the simulator's oracle: true output lengths).
Each keeps its jobs sorted by `key`; none has levels or settings."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from fsd.cost import CostModel
from fsd.jobs import Job
from fsd.sched.queues import JobQueue


class _SortedQueue(JobQueue):
    """Jobs kept sorted by `key` (bisect insertion: O(log n) search, cheap memmove).

    Each job's key is remembered, so a policy whose keys change as jobs run (SRPT)
    re-places just the jobs that ran instead of re-sorting the queue.
    """

    def __init__(self, cost: CostModel) -> None:
        super().__init__(cost)
        self._keys: list[tuple] = []
        self._order: list[Job] = []
        self._key_of: dict[str, tuple] = {}

    def add(self, job: Job, now: float) -> None:
        self._stamp(job, now)
        self._insert(job)

    def _insert(self, job: Job, k: tuple | None = None) -> None:
        if k is None:
            k = self.key(job)
        i = bisect.bisect_right(self._keys, k)
        self._keys.insert(i, k)
        self._order.insert(i, job)
        self._key_of[job.job_id] = k

    def remove(self, job: Job) -> None:
        k = self._key_of.pop(job.job_id, None)
        if k is None:
            return
        i = self._index(job, k)
        if i < len(self._order):
            del self._keys[i], self._order[i]

    def _index(self, job: Job, k: tuple) -> int:
        """Where `job`, queued under key `k`, sits (len(queue) if it is not there)."""
        i = bisect.bisect_left(self._keys, k)
        while i < len(self._order) and self._order[i] is not job:
            i += 1
        return i

    def ordered(self) -> list[Job]:
        return self._order

    def rank(self, job: Job) -> int:
        return bisect.bisect_left(self._keys, self._key_of.get(job.job_id, self.key(job)))

    def __len__(self) -> int:
        return len(self._order)


class FCFSQueue(_SortedQueue):
    """Arrival order: running jobs keep running (vLLM-style iteration-level FCFS)."""

    name = "fcfs"

    def key(self, job: Job) -> tuple:
        return (job.queue_seq,)


class PriorityQueue(_SortedQueue):
    """Fixed priority by input length: shorter prompts first (the paper's first strawman)."""

    name = "priority"

    def key(self, job: Job) -> tuple:
        return (job.num_prompt_tokens, job.queue_seq)


class SRPTQueue(_SortedQueue):
    """Shortest remaining processing time, knowing each job's true output length.

    An oracle for the simulator (jobs carry `oracle_output_len`); the engine never
    knows output lengths, so this policy refuses jobs without one.
    """

    name = "srpt"

    def add(self, job: Job, now: float) -> None:
        if job.oracle_output_len is None:
            raise ValueError(f"srpt needs the output length of {job.job_id} (simulator only)")
        super().add(job, now)

    def key(self, job: Job) -> tuple:
        return (self.remaining_time(job), job.queue_seq)

    def account(self, ran: Iterable[tuple[Job, float]], now: float) -> list[Job]:
        """Jobs that ran have less left: move just them to their new places.

        Runs for every job of every batch: a job whose new key still sits between its
        neighbours' (the usual case, one step changes little) is re-keyed in place here.
        """
        keys, order, key_of = self._keys, self._order, self._key_of
        key, bisect_left = self.key, bisect.bisect_left
        for job, _ in ran:
            job.last_run = now
            old = key_of.get(job.job_id)
            if old is None:
                continue
            new = key(job)
            i = bisect_left(keys, old)
            n = len(order)
            while i < n and order[i] is not job:
                i += 1
            if i == n:
                continue
            if (i == 0 or keys[i - 1] <= new) and (i + 1 >= n or new <= keys[i + 1]):
                keys[i] = new
                key_of[job.job_id] = new
            else:
                del keys[i], order[i]
                self._insert(job, new)
        return []

    def level_backlog(self, job: Job, batch_size: int) -> float:
        """Seconds of work queued beside `job` that `enst_fn` does not count (0 here: a
        ranking's ENST already counts every job ahead)."""
        return 0.0

    def tokens_left(self, job: Job) -> float | None:
        return float(max((job.oracle_output_len or 0) - job.num_output_tokens, 0))

    def remaining_time(self, job: Job) -> float:
        """Its prefill if due, then one decode step at today's context per token left
        (computed for every job that ran, every iteration: kept branch-cheap)."""
        c = self.cost
        left = (job.oracle_output_len or 0) - job.num_output_tokens
        t = 0.0
        if job.num_computed_tokens == 0:
            hint = job.prefix_hint  # reused from the prefix cache
            t = (
                c.chunk_time(job.num_new_tokens - hint, hint)
                if hint
                else c.prefill_time(job.num_new_tokens)
            )
            left -= 1
        elif job.num_new_tokens > 1:  # partly prefilled: the rest of its prefill
            t = c.chunk_time(job.num_new_tokens, job.num_computed_tokens)
            left -= 1
        if left <= 0:
            return t
        return t + left * (
            c.decode_base + c.decode_per_seq + c.decode_per_ctx_token * job.num_tokens
        )
