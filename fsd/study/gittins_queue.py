"""Gittins-ranked levels (DESIGN §4): a policy kept for study; judged by their worst
validation point, sj-mlfq and fsd do better (docs/scheduling.md, "Validation").

Three rules, each with a reason rather than a fitted constant:

1. Rank by the Gittins index of the remaining service (`fsd.study.ranks`): the
   prompt's prefill is known, the output length is learned from finished jobs of the
   same prompt class (SOAP). Per-token latency weighs a completion by 1/L, so the
   index is the weighted one. The rank (seconds per weighted completion) picks the
   level as skip-join does with a prefill: the highest level whose quantum covers it.
   Levels are a factor `quantum_ratio` apart and FIFO inside, so two jobs swap order
   only when their ranks differ by that factor (Nudge: reorder only clearly
   different jobs; near-equal ones keep arrival order, which is what bounds FCFS's tail).
   A job is re-ranked each time it runs, when its KV is dropped, and when the
   learned window its rank reads is rebuilt.
2. FCFS-turn guard, in place of starvation timers: at arrival a job records the
   expected work queued ahead of it (the sum of every queued job's expected remaining
   service). Once the machine has served that much since, FCFS would be serving it,
   and the job gets what FCFS would give it then: a job still waiting moves to Q1
   until it runs (FCFS would start it now); a job already started keeps Q1 to its end
   (FCFS would be running it to its end). No constant sets when: the backlog does.
   Pinning waiting jobs too (FCFS for every late job), or keeping them at Q1 to their
   first token, held the tail but gave up most of the gain on bursty workloads; no
   guard lost the tail on alike jobs and long summaries (README, "Validation").
3. Preemption by expected benefit: a job of the last batch ranks as if its rank were
   lower by what preempting it costs (its KV out to the host and back). A waiting job
   takes its place only if it is ahead even so (Gittins with switching costs); a job
   whose rank is below that cost is never preempted.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fsd.config_checks import doc
from fsd.cost import CostModel
from fsd.jobs import FinishReason, Job
from fsd.sched.lengths import UNKNOWN_CAP, LearnedLengths
from fsd.sched.levels import LevelQueue
from fsd.sched.queues import JobQueue
from fsd.study.ranks import ServiceRanks, prompt_class

_by_queue_seq = operator.attrgetter("queue_seq")
_job_id = operator.attrgetter("job_id")


@dataclass(frozen=True)
class GittinsSettings:
    """The gittins policy's own settings (`gittins.guard` and so on): each rule can be
    switched off alone, as bench/validation.py does to measure its effect."""

    guard: bool = doc(True, "Rule 2: a job FCFS would be serving by now moves to Q1.")
    lift: bool = doc(True, "Rule 3: a running job ranks higher by its KV's round trip.")
    by_prompt: bool = doc(True, "Learn output lengths per prompt class (off: one window).")


class GittinsQueue(LevelQueue):
    """Levels ranked by the Gittins index; the FCFS-turn guard; switch-cost lifts.

    A sibling of the MLFQ family on the level-queue base: no starvation timer (the
    guard bounds waiting), no demotion by quantum (a job's level is its rank's)."""

    Settings = GittinsSettings

    def __init__(
        self,
        cost: CostModel,
        quanta: Sequence[float],
        guard: bool = True,
        lift: bool = True,
        by_prompt: bool = True,
    ) -> None:
        super().__init__(cost, quanta)
        self.name = "gittins"
        # each rule can be switched off alone: bench/validation.py measures each one's effect
        self.guard, self.lift = guard, lift
        self.service = ServiceRanks(by_prompt=by_prompt)
        self.served = 0.0  # every job's charged service so far: the FCFS-turn clock
        self.backlog = 0.0  # sum of the queued jobs' expected remaining service
        self._left: dict[str, float] = {}  # each job's share of `backlog`
        self._members: dict[int, dict[str, Job]] = {}  # prompt class -> its queued jobs
        self._dropped: dict[str, Job] = {}  # KV dropped since the last re-level: re-rank
        self._seen: dict[int, int] = {}  # id(window) -> its version when last re-levelled
        self._rank: dict[str, float] = {}
        self._boosted: set[str] = set()  # guarded jobs at Q1
        self._pinned: set[str] = set()  # guarded after they started: Q1 until they end
        # (FCFS turn, seq, job) min-heap, lazy: a job that ended before its turn stays
        # until pruned (LevelQueue._pruned: at most 2x the queue plus a slack)
        self._turns: list[tuple[float, int, Job]] = []
        self._tseq = itertools.count()
        self._version = self.service.version
        self._step0, self._per_ctx = cost.decode_line()

    # ---- one job's numbers -------------------------------------------------------

    def _measure(self, job: Job) -> float:
        """Re-rank the job and its share of the backlog; returns its rank.

        It reads the prefill left and one decode step of the job alone
        (`decode_line` is `job_iteration_time(1, n)` without the call)."""
        n, done = job.num_tokens, job.num_computed_tokens or job.prefix_hint
        new = n - done
        prefill = 0.0
        if new > 1:
            prefill = self.cost.chunk_time(new, done) if done else self.cost.prefill_time(new)
        # the client's max_tokens, never max_output: the simulator's jobs end there (an oracle)
        rank, left = self.service.measure(
            job.num_prompt_tokens,
            job.num_output_tokens,
            prefill,
            self._step0 + self._per_ctx * n,
            job.params.max_tokens,
        )
        jid = job.job_id
        self.backlog += left - self._left.get(jid, 0.0)
        self._left[jid] = left
        self._rank[jid] = rank
        return rank

    # ---- membership ------------------------------------------------------------

    def add(self, job: Job, now: float) -> None:
        job.last_run = job.starve_since = now
        ahead = self.backlog
        rank = self._measure(job)
        self._members.setdefault(prompt_class(job.num_prompt_tokens), {})[job.job_id] = job
        if self.guard:
            heapq.heappush(self._turns, (self.served + ahead, next(self._tseq), job))
        self._place(job, self.entry_level(rank))

    def remove(self, job: Job) -> None:
        self._unlink(job)
        self._turns = self._pruned(self._turns, self._turn_due)
        jid = job.job_id
        self.backlog -= self._left.pop(jid, 0.0)
        self._rank.pop(jid, None)
        members = self._members.get(prompt_class(job.num_prompt_tokens))
        if members is not None:
            members.pop(jid, None)
        self._dropped.pop(jid, None)
        self._boosted.discard(jid)
        self._pinned.discard(jid)
        if job.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.service.observe(job.num_prompt_tokens, job.num_output_tokens)

    def _turn_due(self, entry: tuple[float, int, Job]) -> bool:
        """A guard entry still to act on: its job is queued and not yet boosted."""
        job = entry[2]
        return job in self and job.job_id not in self._boosted

    def dropped(self, jobs: Iterable[Job]) -> None:
        """Their KV was dropped: their prefill is back, their rank is stale."""
        for job in jobs:
            self._dropped[job.job_id] = job

    def _knows(self, job: Job) -> bool:
        """Whether its rank says anything yet: lengths learned, or a max_tokens prior."""
        return self.service.ready or self.service.has_prior(job.params.max_tokens)

    # ---- moves -----------------------------------------------------------------

    def tick(self, now: float) -> list[Job]:
        """Guard: a job whose FCFS turn has come moves to Q1 (to its end if started)."""
        moved: list[Job] = []
        turns = self._turns
        while turns and turns[0][0] <= self.served:
            _, _, job = heapq.heappop(turns)
            if job not in self or job.job_id in self._boosted:
                continue
            self._boosted.add(job.job_id)
            if job.num_output_tokens:
                self._pinned.add(job.job_id)
            job.promotions += 1
            self._place(job, 0)
            moved.append(job)
        return moved

    def account(self, ran: Iterable[tuple[Job, float]], now: float) -> list[Job]:
        """Charge service to the FCFS-turn clock and re-rank the jobs that ran."""
        demoted: list[Job] = []
        ready = self.service.ready
        to_profile = 1.0 / self.live_scale  # the backlog is in profile seconds
        levels, boosted, pinned = self._levels, self._boosted, self._pinned
        n = len(levels)
        served = self.served
        for job, service in ran:
            job.last_run = job.starve_since = now
            served += service * to_profile
            jid, level = job.job_id, job.level
            if not 0 <= level < n or jid not in levels[level]:
                continue  # left the queue meanwhile
            rank = self._measure(job)
            if jid in boosted:
                if jid in pinned:
                    continue
                boosted.discard(jid)  # started at its turn: ranked again
            if not (ready or self._knows(job)):
                continue  # nothing learned, no cap: it keeps its skip-join place
            to = self.entry_level(rank)
            if to != level:
                if to > level:
                    job.demotions += 1
                    demoted.append(job)
                self._place(job, to)
        self.served = served
        if self.service.version != self._version:
            self._relevel()
        return demoted

    def _relevel(self) -> None:
        """A learned window was rebuilt: re-rank the jobs it describes.

        Only those: a job's rank reads its prompt class's window (or the pool's) and
        its own tokens, which change only when it runs (re-ranked then) or when its
        KV is dropped (`dropped`). A job that changes level goes where its queue_seq
        puts it (FIFO inside a level). Before the pool is ready every job is
        re-ranked: its rank reads the pool or a prior. Under overload this is a few
        hundred jobs instead of thousands, every few finishes.
        """
        self._version = self.service.version
        service = self.service
        if not service.ready:
            self._relevel_all()
            return
        rebuilt = {
            key for key, window in service.windows() if self._seen.get(key) != window.version
        }
        self._seen = {key: window.version for key, window in service.windows()}
        todo = dict(self._dropped)
        self._dropped = {}
        for cls, members in self._members.items():
            if id(service.window_of(cls)) in rebuilt:
                todo.update(members)
        last = len(self.quanta) - 1
        moves: list[tuple[Job, int]] = []
        # in queue order, as a full re-rank would go
        for job in sorted(todo.values(), key=_by_queue_seq):
            if job not in self:
                continue
            rank = self._measure(job)
            level = 0 if job.job_id in self._boosted else min(self.entry_level(rank), last)
            if level != job.level:
                moves.append((job, level))
        self._move_keeping_order(moves)
        # summed anew in queue order, as a full re-rank would: no drift from the updates
        queued = sorted(
            itertools.chain.from_iterable(map(dict.values, self._levels)), key=_by_queue_seq
        )
        lefts = map(self._left.__getitem__, map(_job_id, queued))
        self.backlog = functools.reduce(operator.add, lefts, 0.0)

    def _move_keeping_order(self, moves: list[tuple[Job, int]]) -> None:
        """Move jobs between levels without new queue_seqs: each level stays FIFO."""
        levels = self._levels
        arriving: dict[int, list[Job]] = {}
        for job, level in moves:
            del levels[job.level][job.job_id]
            job.level = level
            arriving.setdefault(level, []).append(job)
        for level, jobs in arriving.items():
            merged = sorted(itertools.chain(levels[level].values(), jobs), key=_by_queue_seq)
            levels[level] = {job.job_id: job for job in merged}

    def _relevel_all(self) -> None:
        """Re-rank every job, keeping FIFO order per level (the backlog summed anew)."""
        self._seen = {key: window.version for key, window in self.service.windows()}
        self._dropped = {}
        jobs = sorted(self.ordered(), key=_by_queue_seq)
        self._levels = [{} for _ in self.quanta]
        self.backlog = 0.0
        self._left.clear()
        last = len(self.quanta) - 1
        for job in jobs:
            rank = self._measure(job)
            if job.job_id in self._boosted:
                job.level = 0
            elif (
                self.service.ready
                or not job.num_output_tokens
                or self.service.has_prior(job.params.max_tokens)
            ):
                job.level = self.entry_level(rank)
            job.level = min(job.level, last)
            self._levels[job.level][job.job_id] = job

    def adopt(self, other: JobQueue) -> bool:
        """New quanta (level edges) or settings: every job is re-levelled by its rank
        (the guard switched off releases the jobs it moved to Q1)."""
        if type(other) is not type(self):
            return False
        assert isinstance(other, GittinsQueue)
        self.guard, self.lift = other.guard, other.lift
        if not self.guard:
            self._turns, self._boosted, self._pinned = [], set(), set()
        self.service.pool_only(not other.service.by_prompt)
        self._lifted, self._lifted_at = {}, {}
        self.quanta = list(other.quanta)
        self._relevel_all()
        return True

    # ---- preemption by benefit -------------------------------------------------------

    def _lifts(self) -> bool:
        return self.lift

    def _lifted_level(self, job: Job) -> int:
        """Its rank less what preempting it costs: the KV's round trip to the host."""
        if job.job_id in self._boosted:
            return 0
        switch = 2.0 * self.cost.swap_time(job.num_tokens)
        rank = self._rank.get(job.job_id, math.inf)
        return self.entry_level(max(rank - switch, 0.0))

    # ---- views -----------------------------------------------------------------

    def learned(self) -> LearnedLengths:
        return self.service.summary()

    def tokens_left(self, job: Job) -> float | None:
        """Half what its cap leaves, if it has one (the swap gate's weight of a victim)."""
        cap = job.params.max_tokens
        return (cap - job.num_output_tokens) / 2 if 0 < cap < UNKNOWN_CAP else None
