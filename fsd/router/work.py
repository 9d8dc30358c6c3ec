"""The work queued on a replica, by level: what a new job would wait behind there.

Design. A router choosing a replica for a new job wants the service the replica will
run before that job's first iteration. Under skip-join MLFQ that depends on where
the job enters (its level L, by its prefill time), not on the queue's length: a job
queued at level l < L runs until it is demoted to L (it then goes to L's tail,
behind the new job), a job queued at L itself runs out its quantum there first, and
jobs below L wait. Each is also capped by what it is expected to need at all: its
prefill left (not charged at the skip-join level, fsd's rule) plus its expected
decode steps (`JobQueue.tokens_left`, learned from finished jobs; unknown: no cap
but the levels'). This is the paper's ENST, T_execute, seen from a job that has not
arrived yet, with the jobs' own expected service as a second bound.

So for each level L, `ahead[L]` = sum over jobs j at levels l <= L of
prefill_j + min(E_j, D(l, L) - attained_j), with D(l, L) = q_l + ... + q_{L-1} for l < L
and q_L for l = L. A queue without levels (fcfs, srpt, priority) is one level with no
quantum: everything queued is ahead, each job capped by its expected decode, which
such a queue may not know: `DEFAULT_TOKENS` then. Profile seconds, as the quanta;
the router divides by the batch (that many jobs run at once) and scales by the
replica's live cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsd.jobs import JobStatus

if TYPE_CHECKING:
    from fsd.sched.scheduler import Scheduler

# decode steps assumed left for a job whose queue cannot tell and has no levels to cap
DEFAULT_TOKENS = 256


@dataclass(frozen=True)
class LevelWork:
    """A replica's queued work: per level, its jobs, their expected service left, and
    the service a new job entering that level would wait behind (profile seconds)."""

    quanta: tuple[float, ...]
    jobs: tuple[int, ...]
    work: tuple[float, ...]
    ahead: tuple[float, ...]
    running: int
    waiting: int
    mean_output: float  # the output length learned from finished jobs (0: not yet)


def level_starts(quanta: tuple[float, ...]) -> list[float]:
    """P[l] = q_0 + ... + q_{l-1}: the service a job has had when it reaches level l."""
    starts = [0.0]
    for q in quanta:
        starts.append(starts[-1] + q)
    return starts


def contribution(
    level: int, service: float, prefill: float, expected: float, starts: list[float]
) -> list[tuple[int, float]]:
    """(L, seconds) for each level L >= `level` where a job with `service` attained at
    `level` runs before a new job entering L (module doc); the last pair holds for
    every level after it too. Used for queued jobs and for requests routed but not
    yet acknowledged (fsd.router.view)."""
    n = len(starts) - 1
    out = []
    s = starts[level] + service
    for lv in range(level, n):
        until = starts[lv + 1] if lv == level else starts[lv]
        left = until - s
        if left >= expected:
            out.append((lv, prefill + expected))
            break
        out.append((lv, prefill + max(left, 0.0)))
    return out


def queued_work(sched: Scheduler) -> LevelWork:
    """The `LevelWork` of a live scheduler (read after an iteration)."""
    queue, cost = sched.queue, sched.cost
    quanta = tuple(queue.limits()[0]) or (math.inf,)
    n = len(quanta)
    starts = level_starts(quanta)
    step, per_ctx = cost.decode_line()
    flat = n == 1 and quanta[0] == math.inf  # no levels: one, with no quantum
    jobs, work = [0] * n, [0.0] * n
    ahead, after = [0.0] * n, [0.0] * (n + 1)  # after[L]: holds from L on (summed below)
    running = 0
    for job in sched.jobs():
        level = min(max(job.level, 0), n - 1)
        running += job.status is JobStatus.RUNNING
        new = job.num_new_tokens
        prefill = cost.job_iteration_time(new - job.prefix_hint, job.num_tokens) if new > 1 else 0.0
        left = queue.tokens_left(job)
        if left is None:
            left = DEFAULT_TOKENS if flat else math.inf
        expected = left * (step + per_ctx * job.num_tokens)
        attained = 0.0 if flat else job.attained
        pairs = contribution(level, attained, prefill, expected, starts)
        for lv, seconds in pairs[:-1]:
            ahead[lv] += seconds
        last, seconds = pairs[-1]
        after[last] += seconds
        jobs[level] += 1
        work[level] += prefill + min(expected, starts[-1] - starts[level] - attained)
    total = 0.0
    for lv in range(n):
        total += after[lv]
        ahead[lv] += total
    learned = queue.learned()
    mean = learned.mean if learned is not None and learned.ready and learned.mean else 0.0
    return LevelWork(
        quanta, tuple(jobs), tuple(work), tuple(ahead), running, len(sched) - running, mean
    )
