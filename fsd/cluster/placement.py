"""Which replica holds each live job, and what a replica's death does to its jobs.

A job that has not produced a token yet keeps its admitted request: if its replica
dies, it is placed again elsewhere and its client sees nothing but a later start. A
job that had started is ended with the error: its KV died with the replica.
"""

from __future__ import annotations

from fsd.admission import JobRequest


class Placement:
    """Live jobs by replica; the not-yet-started ones with their requests (module doc).
    Bounded by the live jobs: an entry leaves when its job finishes."""

    def __init__(self) -> None:
        self.owner: dict[str, int] = {}
        self.pending: dict[str, JobRequest] = {}

    def place(self, job_id: str, index: int, request: JobRequest) -> None:
        self.owner[job_id] = index
        self.pending[job_id] = request

    def started(self, job_id: str) -> None:
        """It produced a token: it can no longer move without its KV."""
        self.pending.pop(job_id, None)

    def finished(self, job_id: str) -> None:
        self.owner.pop(job_id, None)
        self.pending.pop(job_id, None)

    def lost(self, index: int) -> tuple[list[tuple[str, JobRequest]], list[str]]:
        """A replica died: (its jobs to place again, its started jobs to end)."""
        jobs = [j for j, i in self.owner.items() if i == index]
        again = [(j, self.pending[j]) for j in jobs if j in self.pending]
        ended = [j for j in jobs if j not in self.pending]
        for j in jobs:
            self.owner.pop(j)
        return again, ended

    def count(self, index: int) -> int:
        return sum(1 for i in self.owner.values() if i == index)
