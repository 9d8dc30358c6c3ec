"""The default policy's cheap paths decide exactly what the plain ones decide.

P11 made `gittins` cheaper per iteration without changing a decision: a re-level
re-ranks only the jobs whose learned window was rebuilt (or whose KV was dropped),
a decoding job's next ranks are computed AHEAD at a time, a level is found by
bisection, and the walk's order is built from C-level iterators. Each is held here
to the plain version it replaced, on whole simulations (every job's finish time,
first token and preemptions) and on the numbers themselves.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterator

import numpy as np
import pytest

from fsd.config import CacheConfig, SchedConfig
from fsd.cost.profiles import load_profile
from fsd.jobs import Job
from fsd.sched import registry
from fsd.sched.lengths import OutputLengthIndex
from fsd.sched.mlfq import MLFQQueue
from fsd.sched.rules import quanta_for
from fsd.sim.runner import RunSpec
from fsd.study.gittins_queue import GittinsQueue
from fsd.workload import gamma, length_model, synthetic


class FullRelevel(GittinsQueue):
    """The reference: every re-level re-ranks every queued job."""

    def _relevel(self) -> None:
        self._version = self.service.version
        self._relevel_all()


class PlainOrder(GittinsQueue):
    """The reference walk order: one Python generator over every job."""

    def _ordered_lifted(self) -> Iterator[Job]:
        lifted, lifted_at, levels = self._lifted, self._lifted_at, self._levels
        for level, jobs in enumerate(levels):
            for job in lifted_at.get(level, ()):
                if job in self:
                    yield job
            for job in jobs.values():
                if job.job_id not in lifted:
                    yield job


@pytest.fixture
def policies(monkeypatch: pytest.MonkeyPatch) -> None:
    queues = dict(registry.POLICY_TABLE)
    for name, cls in (("gittins-full-relevel", FullRelevel), ("gittins-plain-order", PlainOrder)):
        queues[name] = registry.Policy(
            cls,
            build=lambda _name, config, cost, _own, cls=cls: cls(cost, quanta_for(config, cost)),
        )
    monkeypatch.setattr(registry, "POLICY_TABLE", queues)
    monkeypatch.setattr(registry, "POLICIES", tuple(queues))


def _outcome(policy: str, kv_policy: str, seed: int) -> list[tuple]:
    """Every job's finish, first token and preemptions, on an overloaded bursty mix."""
    cost = load_profile("opt-13b-a100")  # memory-tight: swaps, and drops under recompute
    work = synthetic(gamma(4.0, 4.0), length_model("mix:sharegpt+code-bursty:0.5"), 500, seed)
    work = work.clipped(2048)
    spec = RunSpec(policy, SchedConfig(policy=policy), CacheConfig(kv_policy=kv_policy))
    res = spec.simulator(cost).run(work)
    return sorted(
        (j.job_id, j.finish_time, j.first_token_time, j.preemptions, j.recomputes) for j in res.jobs
    )


@pytest.mark.usefixtures("policies")
@pytest.mark.parametrize("kv_policy", ["proactive", "recompute"])
@pytest.mark.parametrize("reference", ["gittins-full-relevel", "gittins-plain-order"])
def test_same_decisions_as_the_plain_paths(reference: str, kv_policy: str):
    fast = _outcome("gittins", kv_policy, seed=7)
    assert fast == _outcome(reference, kv_policy, seed=7)
    # the run exercised what is compared: preemptions, and dropped KV under recompute
    assert sum(row[3] for row in fast) > 100
    if kv_policy == "recompute":
        assert sum(row[4] for row in fast) > 0


def _rank_steps_one_at_a_time(lengths: list[int], attained: int, weight: float) -> float:
    """The sweep over horizons for one attained count, as rank_steps did it before."""
    xs = np.array(sorted(lengths), dtype=np.int64)
    start = bisect.bisect_right(xs.tolist(), attained)
    m = len(xs) - start
    if not m:
        return math.inf
    rest = xs[start:] - attained
    gain = np.cumsum(1.0 / xs[start:]) / weight
    spent = m * 0.0 + np.cumsum(rest) + np.arange(m - 1, -1, -1) * rest
    return float((spent / gain).min())


@pytest.mark.parametrize("seed", range(4))
def test_decode_ranks_ahead_are_the_one_at_a_time_values(seed: int):
    rng = random.Random(seed)
    lengths = [max(1, int(rng.lognormvariate(4, 1.2))) for _ in range(256)]
    index = OutputLengthIndex(window=256, min_samples=8, refresh=1)
    for n in lengths:
        index.observe(n)
    weight = index.mean_inverse
    for attained in itertools.chain(range(0, 300), rng.sample(range(300, 5000), 50)):
        got = index.rank_steps(attained, 0.0, weight)
        assert got == _rank_steps_one_at_a_time(lengths, attained, weight)  # exactly


def test_a_decode_rank_ahead_is_not_reused_under_another_weight():
    index = OutputLengthIndex(window=64, min_samples=4, refresh=1)
    for n in (5, 9, 40, 41, 300):
        index.observe(n)
    first = index.rank_steps(0, 0.0, 0.5)
    # attained 1 was computed ahead under weight 0.5; asked under 0.25 it is recomputed
    assert index.rank_steps(1, 0.0, 0.25) == _rank_steps_one_at_a_time([5, 9, 40, 41, 300], 1, 0.25)
    assert first == _rank_steps_one_at_a_time([5, 9, 40, 41, 300], 0, 0.5)


def test_entry_level_by_bisection_is_the_first_covering_quantum():
    cost = load_profile("opt-13b-a100")
    q = MLFQQueue(cost, [0.5 * 2**k for k in range(6)], math.inf)

    def linear(t: float) -> int:
        for i, quantum in enumerate(q.quanta):
            if quantum >= t:
                return i
        return len(q.quanta) - 1

    values = [0.0, 0.5, 0.5000001, 1.0, 15.99, 16.0, 16.5, 1e9, math.inf, math.nan, -1.0]
    values += [random.Random(1).uniform(0, 40) for _ in range(200)]
    assert [q.entry_level(t) for t in values] == [linear(t) for t in values]
