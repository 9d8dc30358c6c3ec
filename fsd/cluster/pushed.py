"""What the replicas pushed, read instead of asking them: their latest views, and what
each live job has made so far.

Design: a question a replica answers between two of its steps makes the daemon wait
for that step, one question after another (docs/history.md), and waits for ever on a
replica that hangs. So each
replica pushes a view with its reports (`fsd.cluster.worker.View`: its snapshot and
job table, at most `VIEW_EVERY` stale) and status, job lists and telemetry read the
latest ones; and an abort is told, not asked: its answer is made here from the
tokens the job's replica reported (`Progress`), and whatever the replica still sends
for it is dropped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from fsd.cluster.worker import View
from fsd.engine.output import RequestOutput, StepDelta
from fsd.engine.views import EngineSnapshot
from fsd.protocol_telemetry import JobInfo


class Views:
    """Each replica's latest view."""

    def __init__(self) -> None:
        self.latest: dict[int, View] = {}
        self._rows: dict[str, JobInfo] | None = None  # every view's rows by job id

    def update(self, index: int, view: View) -> None:
        self.latest[index] = view
        self._rows = None

    def forget(self, index: int) -> None:
        """A replica went down or came back: its last view no longer holds."""
        self.latest.pop(index, None)
        self._rows = None

    def snapshots(self, up: Iterable[int], with_jobs: bool, detail: bool) -> dict[int, EngineSnapshot]:
        """The up replicas' snapshots that came (lighter as asked)."""
        out = {}
        for i in up:
            view = self.latest.get(i)
            if view is None:
                continue
            snap = view.snapshot
            if not detail:
                snap = dataclasses.replace(snap, jobs=None, sched=dataclasses.replace(snap.sched, levels=[]))
            elif not with_jobs:
                snap = dataclasses.replace(snap, jobs=None)
            out[i] = snap
        return out

    def jobs(self, up: Iterable[int]) -> list[JobInfo]:
        return [j for i in up if i in self.latest for j in self.latest[i].snapshot.jobs or []]

    def job(self, job_id: str) -> JobInfo | None:
        if self._rows is None:
            self._rows = {j.job_id: j for v in self.latest.values() for j in v.snapshot.jobs or []}
        return self._rows.get(job_id)

    def level_counts(self, up: Iterable[int]) -> dict[int, tuple[int, int]]:
        total: dict[int, tuple[int, int]] = {}
        for i in up:
            if i in self.latest:
                for level, (r, w) in self.latest[i].level_counts.items():
                    had = total.get(level, (0, 0))
                    total[level] = (had[0] + r, had[1] + w)
        return total


@dataclass
class _Made:
    arrival: float
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    first: float | None = None  # when its first token was reported


class Progress:
    """What each live job has made, as its replica reported it (module doc)."""

    def __init__(self) -> None:
        self.jobs: dict[str, _Made] = {}

    def placed(self, job_id: str, arrival: float) -> None:
        self.jobs.setdefault(job_id, _Made(arrival))

    def saw(self, delta: StepDelta) -> None:
        if delta.finished:
            self.jobs.pop(delta.job_id, None)
            return
        made = self.jobs.get(delta.job_id)
        if made is not None and delta.new_token_ids:
            made.tokens.extend(delta.new_token_ids)
            made.text.append(delta.new_text)
            if made.first is None:
                made.first = time.time()

    def ended(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def aborted(self, job_id: str) -> RequestOutput:
        """The result of a job aborted now: what it made so far."""
        made = self.jobs.pop(job_id, None) or _Made(time.time())
        return RequestOutput(
            request_id=job_id, prompt=None, prompt_token_ids=[], text="".join(made.text),
            token_ids=made.tokens, finish_reason="abort", arrival_time=made.arrival,
            first_token_time=made.first, finish_time=time.time(),
        )  # fmt: skip
