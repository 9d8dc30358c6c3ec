"""Gittins-ranked levels: fsd's default policy (DESIGN §4; README, "Scheduling results").

Three rules, each with a reason rather than a fitted constant:

1. Rank by the Gittins index of the remaining service (`fsd.sched.service`): the
   prompt's prefill is known, the output length is learned from finished jobs of the
   same prompt class (SOAP). Per-token latency weighs a completion by 1/L, so the
   index is the weighted one. The rank (seconds per weighted completion) picks the
   level as skip-join does with a prefill: the highest level whose quantum covers it.
   Levels are a factor `quantum_ratio` apart and FIFO inside, so two jobs swap order
   only when their ranks differ by that factor (Nudge: reorder only clearly
   different jobs; near-equal ones keep arrival order, which is what bounds FCFS's tail).
   A job is re-ranked each time it runs and when the learned windows are rebuilt.
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

import heapq
import itertools
import math
from collections.abc import Iterable, Sequence

from fsd.cost import CostModel
from fsd.jobs import FinishReason, Job
from fsd.sched.gittins import LearnedLengths
from fsd.sched.mlfq import MLFQQueue
from fsd.sched.queues import JobQueue
from fsd.sched.service import ServiceRanks


class GittinsQueue(MLFQQueue):
    """Skip-join levels ranked by the Gittins index; the FCFS-turn guard; switch-cost lifts."""

    def __init__(
        self,
        cost: CostModel,
        quanta: Sequence[float],
        guard: bool = True,
        lift: bool = True,
        by_prompt: bool = True,
    ) -> None:
        super().__init__(cost, quanta, math.inf, skip_join=True)
        self.name = "gittins"
        # each rule can be switched off alone: bench/validation.py measures each one's effect
        self.guard, self.lift = guard, lift
        self.service = ServiceRanks(by_prompt=by_prompt)
        self.served = 0.0  # every job's charged service so far: the FCFS-turn clock
        self.backlog = 0.0  # sum of the queued jobs' expected remaining service
        self._left: dict[str, float] = {}  # each job's share of `backlog`
        self._rank: dict[str, float] = {}
        self._boosted: set[str] = set()  # guarded jobs at Q1
        self._pinned: set[str] = set()  # guarded after they started: Q1 until they end
        self._turns: list[tuple[float, int, Job]] = []  # (FCFS turn, seq, job) min-heap
        self._tseq = itertools.count()
        self._version = self.service.version

    # ---- one job's numbers -------------------------------------------------------

    def _costs(self, job: Job) -> tuple[float, float]:
        """(its prefill left, one decode step of it alone) in seconds."""
        c = self.cost
        new, done = job.num_new_tokens, job.num_computed_tokens
        prefill = 0.0
        if new > 1:
            prefill = c.chunk_time(new, done) if done else c.prefill_time(new)
        return prefill, c.job_iteration_time(1, job.num_tokens)

    def _measure(self, job: Job) -> float:
        """Re-rank the job and its share of the backlog; returns its rank."""
        prefill, step = self._costs(job)
        # the client's max_tokens, never max_output: the simulator's jobs end there (an oracle)
        p, a, cap = job.num_prompt_tokens, job.num_output_tokens, job.params.max_tokens
        rank = self.service.rank(p, a, prefill, step, cap)
        left = self.service.expected_left(p, a, prefill, step, cap)
        self.backlog += left - self._left.get(job.job_id, 0.0)
        self._left[job.job_id] = left
        self._rank[job.job_id] = rank
        return rank

    # ---- membership ------------------------------------------------------------

    def add(self, job: Job, now: float) -> None:
        job.last_run = job.starve_since = now
        ahead = self.backlog
        rank = self._measure(job)
        if self.guard:
            heapq.heappush(self._turns, (self.served + ahead, next(self._tseq), job))
        self._place(job, self.entry_level(rank))

    def remove(self, job: Job) -> None:
        self._unlink(job)
        jid = job.job_id
        self.backlog -= self._left.pop(jid, 0.0)
        self._rank.pop(jid, None)
        self._boosted.discard(jid)
        self._pinned.discard(jid)
        if job.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.service.observe(job.num_prompt_tokens, job.num_output_tokens)

    def _knows(self, job: Job) -> bool:
        """Whether its rank says anything yet: lengths learned, or a max_tokens prior."""
        return self.service.ready or self.service.has_prior(job.params.max_tokens)

    def _watch(self, job: Job) -> None:
        """No starvation timer: the FCFS-turn guard (`tick`) bounds waiting."""

    def _due(self, job: Job) -> float:
        return math.inf

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
        for job, service in ran:
            job.last_run = job.starve_since = now
            self.served += service * to_profile
            if job not in self:
                continue
            rank = self._measure(job)
            if job.job_id in self._boosted and job.job_id not in self._pinned:
                self._boosted.discard(job.job_id)  # started at its turn: ranked again
            elif job.job_id in self._boosted:
                continue
            if not (ready or self._knows(job)):
                continue  # nothing learned, no cap: it keeps its skip-join place
            level = self.entry_level(rank)
            if level != job.level:
                if level > job.level:
                    job.demotions += 1
                    demoted.append(job)
                self._place(job, level)
        if self.service.version != self._version:
            self._relevel()
        return demoted

    def _relevel(self) -> None:
        """The learned windows changed: re-rank every job, keeping FIFO order per level."""
        self._version = self.service.version
        jobs = sorted(self.ordered(), key=lambda j: j.queue_seq)
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
        """New quanta (level edges): every job is re-levelled by its rank."""
        if type(other) is not type(self):
            return False
        assert isinstance(other, GittinsQueue)
        self._lifted, self._lifted_at = {}, {}
        self.quanta = list(other.quanta)
        self._relevel()
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

    def limits(self) -> tuple[list[float], float | None, float | None]:
        return list(self.quanta), None, None

    def learned(self) -> LearnedLengths:
        return self.service.summary()
