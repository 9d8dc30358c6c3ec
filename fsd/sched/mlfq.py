"""Multi-level feedback queues: naive MLFQ and FastServe's skip-join MLFQ (paper §4.1).

Why skip-join: a job's first iteration (prefill) can be far longer than q1. Entering
every job at Q1 lets one long prompt occupy the top level for a whole prefill (head of
line blocking again); entering at the highest level whose quantum covers the predicted
prefill puts it where its first iteration belongs, without knowing its output length.

Service is charged in profiled iteration time. Starvation: a job that has waited alpha
since it last ran moves up; ENST combines that clock with the work queued above it.

Three policies share this class, each with its rules (fsd.sched.rules): `sj-mlfq`,
the paper's section 4 as written; `fsd`, the default, with each of its departures
from the paper a setting of its own; and plain `mlfq`, every job entering Q1.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence

from fsd.cost import CostModel
from fsd.jobs import FinishReason, Job
from fsd.sched.fresh_caps import FreshCaps, keeps_level
from fsd.sched.lengths import UNKNOWN_CAP, LearnedLengths, OutputLengthIndex
from fsd.sched.levels import LevelQueue
from fsd.sched.queues import JobQueue

DEMOTE_RULES = ("always", "gittins")
_has_output = operator.attrgetter("output_token_ids")


def _entry_now(queue: MLFQQueue, job: Job) -> int:
    """The level the job's next iteration would skip-join."""
    return queue.entry_level(queue.cost.job_iteration_time(job.num_new_tokens, job.num_tokens))


# where a starved job goes, by the promote rule
_PROMOTED = {"up1": lambda _q, job: job.level - 1, "top": lambda _q, _job: 0, "entry": _entry_now}
PROMOTE_RULES = tuple(_PROMOTED)


def build_quanta(q1: float, ratio: float, levels: int) -> list[float]:
    """q_{k+1} = ratio * q_k."""
    return [q1 * ratio**k for k in range(levels)]


class MLFQQueue(LevelQueue):
    """Levels Q1..Qn with quanta q1 < q2 < ..., FIFO inside a level (owners take turns
    inside a level: fsd.sched.fair_share). The rules are fsd.sched.rules' (alphas here in
    seconds); skip_join=False is the naive MLFQ, where the skip-join-only rules (free
    prefill, gittins demotion, waiting alpha, threshold) are off."""

    fair = True

    def __init__(
        self,
        cost: CostModel,
        quanta: Sequence[float],
        starve_limit: float,
        skip_join: bool = True,
        promote_to: str = "up1",
        charge_prefill: bool = False,
        demote_rule: str = "always",
        waiting_limit: float | None = None,
        preempt_threshold: int = 0,
    ) -> None:
        super().__init__(cost, quanta)
        self.name = "sj-mlfq" if skip_join else "mlfq"
        self.skip_join = skip_join
        self.promote_to = promote_to
        self.charge_prefill = charge_prefill or not skip_join
        self.demote_rule = demote_rule if skip_join else "always"
        self.lengths = OutputLengthIndex()  # learned from every finish; read by "gittins"
        self.starve_limit = starve_limit
        # fsd's rules for skip-join only: naive MLFQ stays the textbook baseline
        self.waiting_limit = (
            starve_limit if waiting_limit is None or not skip_join else waiting_limit
        )
        self.preempt_threshold = preempt_threshold if skip_join else 0
        # (promotion due, seq, job), lazy: stale entries are skipped when popped, and
        # pruned once they could outnumber the queued jobs (LevelQueue._pruned)
        self._starve: list[tuple[float, int, Job]] = []
        self._fresh = FreshCaps(self._waiting)  # the gittins rule's cold start

    # ---- membership ------------------------------------------------------------

    def add(self, job: Job, now: float) -> None:
        level = 0
        if self.skip_join:
            level = self.entry_level(
                # the prefill it will do: what the prefix cache held at arrival is reused
                self.cost.job_iteration_time(job.num_new_tokens - job.prefix_hint, job.num_tokens)
            )
        job.last_run = now
        job.starve_since = now
        self._place(job, level)
        if not job.output_token_ids:
            self._fresh.stale()

    def remove(self, job: Job) -> None:
        self._unlink(job)
        if not job.output_token_ids:
            self._fresh.stale()
        self._starve = self._pruned(self._starve, self._current)
        if job.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.lengths.observe(job.num_output_tokens)

    def _watch(self, job: Job) -> None:
        """Start the job's starvation clock; Q1 jobs have nowhere higher to go. One heap
        entry per placement: `tick` re-pushes an outdated one (a heap op per alpha)."""
        if job.level > 0:
            heapq.heappush(self._starve, (self._due(job), job.queue_seq, job))
            self._starve = self._pruned(self._starve, self._current)

    def _current(self, entry: tuple[float, int, Job]) -> bool:
        """A starvation entry still in force: its job is queued, not placed since."""
        _, seq, job = entry
        return seq == job.queue_seq and job in self

    def _due(self, job: Job) -> float:
        """When the job is promoted unless it runs first.

        Alpha is a count of SLOs, decode steps of the profile; on a machine slower than
        its profile (live cost, fsd.cost.calibration) a step takes `live_scale` times
        as long, and so does alpha: else a slow machine would promote a waiting job
        past the running ones within a few iterations, and identical jobs would take
        turns (tests/engine/test_identical_jobs.py).
        """
        alpha = self.starve_limit if job.num_output_tokens else self.waiting_limit
        return job.starve_since + alpha * self.live_scale

    def _lifts(self) -> bool:  # whether `set_running` lifts anything
        return self.preempt_threshold > 0

    def _lifted_level(self, job: Job) -> int:
        """The level a job of the last batch ranks at (`preempt_threshold` above its own)."""
        threshold = self.preempt_threshold
        return job.level - threshold if job.level > threshold else 0

    def adopt(self, other: JobQueue) -> bool:
        """New quanta / alpha / promotion rule; jobs below a removed level go to the last."""
        if not isinstance(other, MLFQQueue) or other.skip_join != self.skip_join:
            return False
        self._lifted, self._lifted_at = {}, {}
        jobs = list(self.ordered())
        self.quanta = list(other.quanta)
        self.starve_limit = other.starve_limit
        self.waiting_limit = other.waiting_limit
        self.preempt_threshold = other.preempt_threshold
        self.promote_to = other.promote_to
        self.charge_prefill = other.charge_prefill
        self.demote_rule = other.demote_rule
        if len(self._levels) != len(self.quanta):
            self._levels = [{} for _ in self.quanta]
            last = len(self.quanta) - 1
            for job in jobs:
                job.level = min(job.level, last)
            # a level's order is `key`'s (FIFO, or owners' turns): the jobs folded
            # into the last level go among its own by their turns and placement
            for job in sorted(jobs, key=lambda j: (j.level, j.fair_round, j.queue_seq)):
                self._levels[job.level][job.job_id] = job
            self._regroup()
        # the promotion times follow the new alphas
        self._starve = [(self._due(j), j.queue_seq, j) for j in jobs if j.level > 0]
        heapq.heapify(self._starve)
        return True

    # ---- time-driven moves -----------------------------------------------------

    def tick(self, now: float) -> list[Job]:
        """Promote every job whose starvation clock has reached the limit."""
        moved: list[Job] = []
        while self._starve and self._starve[0][0] <= now:
            due, seq, job = heapq.heappop(self._starve)
            if seq != job.queue_seq or job not in self:
                continue  # stale entry: the job moved or left since it was pushed
            rearmed = self._due(job)
            if due != rearmed:  # it ran since: one entry per job, re-armed lazily
                heapq.heappush(self._starve, (rearmed, seq, job))
                continue
            target = _PROMOTED[self.promote_to](self, job)
            job.starve_since = now
            if target >= job.level:  # nowhere higher to go: restart the clock only
                self._watch(job)
                continue
            job.promotions += 1
            self._place(job, target)
            moved.append(job)
        return moved

    def account(self, ran: Iterable[tuple[Job, float]], now: float) -> list[Job]:
        """Charge service; demote the jobs whose quantum at their level is spent."""
        demoted: list[Job] = []
        last = len(self.quanta) - 1
        levels, quanta, free_prefill = self._levels, self.quanta, not self.charge_prefill
        moved_on = self._rounds.ran if self.fair else None  # the level's turns (fair only)
        lengths = self.lengths if self.demote_rule == "gittins" else None
        ran = list(ran)
        if any(len(job.output_token_ids) <= 1 for job, _ in ran):
            self._fresh.stale()  # a first token, maybe: the waiting jobs' caps may change
        for job, service in ran:
            job.last_run = now
            job.starve_since = now
            level = job.level
            if not 0 <= level <= last or levels[level].get(job.job_id) is not job:
                continue  # left the queue meanwhile
            if moved_on is not None:
                moved_on(level, job)
            if free_prefill and job.last_prefill:
                continue
            job.attained = attained = job.attained + service
            if attained + 1e-12 < quanta[level]:
                continue  # its starvation entry stays; tick re-arms it from starve_since
            if lengths is not None and keeps_level(lengths, job, self._fresh):
                job.attained = 0.0  # a fresh quantum here, ahead of the later jobs
                continue
            target = min(job.level + 1, last)
            if self.skip_join:
                nxt = self.cost.job_iteration_time(job.num_new_tokens, job.num_tokens)
                target = max(target, min(self.entry_level(nxt), last))
            if target != job.level:
                job.demotions += 1
                demoted.append(job)
            self._place(job, target)
        return demoted

    def _waiting(self) -> Iterator[Job]:
        """The queued jobs that have not produced a token, in the levels' order."""
        return itertools.filterfalse(
            _has_output, itertools.chain.from_iterable(map(dict.values, self._levels))
        )

    # ---- views -----------------------------------------------------------------

    def limits(self) -> tuple[list[float], float | None, float | None]:
        return list(self.quanta), self.starve_limit, self.waiting_limit

    def learned(self) -> LearnedLengths:
        return self.lengths.summary()

    def tokens_left(self, job: Job) -> float | None:
        """Decode steps per unit of completion the job is expected to need: 1 / its
        Gittins index (fsd.sched.lengths; equal to the tokens left when outputs are
        alike, smaller than their mean when most are short). Before lengths are
        learned: half its cap, if it has one."""
        lengths, done = self.lengths, job.num_output_tokens
        if lengths.ready:
            return lengths.rank_steps(done, 0.0, lengths.mean_inverse)
        cap = job.params.max_tokens
        return (cap - done) / 2 if 0 < cap < UNKNOWN_CAP else None
