"""fsd's default policy: Gittins-ranked levels, the FCFS-turn guard, switch-cost lifts."""

from __future__ import annotations

import dataclasses

import pytest

from fsd.config import SchedConfig
from fsd.jobs import FinishReason, Job, SamplingParams
from fsd.sched.registry import DEFAULT_POLICY, make_queue, resolve_policy
from fsd.study.gittins_queue import GittinsQueue
from fsd.study.ranks import ServiceRanks, prompt_class
from tests.sched.test_mlfq import cost, run_once

QUANTA = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]


def job(prompt: int, name: str, cap: int = 999) -> Job:
    return Job(prompt_token_ids=[1] * prompt, params=SamplingParams(max_tokens=cap), job_id=name)


def finished(prompt: int, out: int, name: str) -> Job:
    j = job(prompt, name)
    j.output_token_ids = [0] * out
    j.finish_reason = FinishReason.LENGTH
    return j


def teach(q: GittinsQueue, prompt: int, outputs: list[int], tag: str = "f") -> None:
    for i, n in enumerate(outputs):
        q.remove(finished(prompt, n, f"{tag}{i}"))


def test_prompt_classes_double():
    assert [prompt_class(n) for n in (1, 127, 128, 255, 256, 2047, 2048, 10**6)] == [
        0, 0, 1, 1, 2, 4, 5, 10,
    ]  # fmt: skip


def test_with_alike_outputs_the_rank_is_the_remaining_service():
    r = ServiceRanks()
    for _ in range(40):
        r.observe(100, 10)
    # prefill 3 s + 10 steps of 0.5 s; after 4 tokens: 6 steps
    assert r.rank(100, 0, 3.0, 0.5) == pytest.approx(8.0)
    assert r.rank(100, 4, 0.0, 0.5) == pytest.approx(3.0)
    assert r.expected_left(100, 4, 0.0, 0.5) == pytest.approx(3.0)


def test_the_prompt_class_conditions_the_output_length():
    # short prompts write long answers, long prompts one token (a code-completion mix)
    by_class, pooled = ServiceRanks(), ServiceRanks(by_prompt=False)
    for r in (by_class, pooled):
        for _ in range(40):
            r.observe(100, 200)
            r.observe(3000, 1)
    long_prompt = (3000, 0, 5.0, 0.1)  # 5 s of prefill, then (its class says) done
    short_prompt = (100, 0, 0.2, 0.1)
    # its service, 5.1 s, per completion worth 1/L = 1 against the mean 1/L (~0.5)
    assert by_class.rank(*long_prompt) == pytest.approx(5.1 * (1 + 1 / 200) / 2)
    assert by_class.rank(*long_prompt) < by_class.rank(*short_prompt)
    # pooled, each fresh job is a coin flip between 1 and 200 tokens
    assert pooled.rank(*long_prompt) > by_class.rank(*long_prompt)
    learned = by_class.summary()
    assert learned.samples == 80 and [c[2] for c in learned.by_prompt] == [200, 1]


def test_before_anything_is_learned_a_job_ranks_by_its_prefill_and_its_cap():
    q = GittinsQueue(cost(), QUANTA)
    a, b = job(10, "a", 1 << 30), job(500, "b", 1 << 30)  # no cap to go by (simulated jobs)
    for j in (a, b):
        q.add(j, 0.0)
    assert (a.level, b.level) == (2, 3)  # prefill 1.1 s and 6 s, + one 1 s step
    run_once(q, b, 1.0)
    assert b.level == 3  # nothing learned, no cap: a started job keeps its place
    capped = GittinsQueue(cost(), QUANTA)
    long_job, short_job = job(10, "long", 500), job(10, "short", 8)
    capped.add(long_job, 0.0)
    run_once(capped, long_job, 1.0)
    capped.add(short_job, 1.0)
    # uniform prior up to the cap: ~250 steps left against 1.1 s + 4 steps
    assert short_job.level < long_job.level == len(QUANTA) - 1


def test_a_job_that_outlived_the_short_outputs_is_demoted_and_one_near_its_end_rises():
    q = GittinsQueue(cost(), QUANTA)
    teach(q, 10, [2] * 36 + [60] * 4)
    j = job(10, "j")
    q.add(j, 0.0)
    entry = j.level
    run_once(q, j, 1.0)  # prefill, first token
    for t in range(2, 5):
        run_once(q, j, float(t))
    assert j.level > entry and j.demotions >= 1  # only the 60-token jobs remain possible
    alike = GittinsQueue(cost(), QUANTA)
    teach(alike, 10, [20] * 40)
    k = job(10, "k")
    alike.add(k, 0.0)
    levels = []
    for t in range(1, 19):
        run_once(alike, k, float(t))
        levels.append(k.level)
    assert levels[-1] < levels[0] and k.demotions == 0  # closer to done, higher


def test_a_job_overtaken_for_as_long_as_fcfs_would_have_made_it_wait_moves_to_q1():
    q = GittinsQueue(cost(), QUANTA)
    teach(q, 10, [5] * 40)
    first = job(10, "first")
    q.add(first, 0.0)
    ahead = q.backlog  # its expected service: 1.1 s prefill + 5 steps
    late = job(900, "late")  # 10 s of prefill: low
    q.add(late, 0.0)
    assert late.level >= 4
    assert q.tick(0.0) == [first]  # nothing was ahead of it: its FCFS turn is now
    short = job(10, "short")
    q.add(short, 1.0)
    turn = ahead  # nothing served yet: FCFS starts late once first's work is done
    while q.served + q.cost.job_iteration_time(short.num_new_tokens, short.num_tokens) < turn:
        run_once(q, short, 2.0)  # a later, shorter job keeps the machine busy; late waits
        assert q.tick(3.0) == []
    run_once(q, short, 4.0)
    assert q.tick(5.0) == [late] and late.level == 0 and late.promotions == 1
    # it had not started: once it has run, it is ranked again like any job
    run_once(q, late, 6.0)
    assert late.level > 0


def test_a_started_job_at_its_fcfs_turn_keeps_q1_to_its_end():
    q = GittinsQueue(cost(), QUANTA)
    teach(q, 10, [2] * 36 + [200] * 4)
    first = job(10, "first")
    q.add(first, 0.0)
    assert q.tick(0.0) == [first]
    later = job(10, "later")
    q.add(later, 0.0)  # its FCFS turn: once first's expected work is served
    for t in range(3):  # it starts early (ahead by rank) and outlives the short outputs
        run_once(q, later, float(t))
    assert later.level > 0 and later.num_output_tokens == 3
    moved: list[Job] = []
    while not moved:
        run_once(q, first, 5.0)
        moved = q.tick(5.0)
    assert moved == [later] and later.level == 0
    for t in range(10):  # FCFS would be running it to its end: it stays at Q1
        run_once(q, later, 6.0 + t)
    assert later.level == 0 and later.demotions == 1


def test_without_the_guard_nothing_moves_to_q1():
    q = GittinsQueue(cost(), QUANTA, guard=False)
    teach(q, 10, [5] * 40)
    late = job(900, "late")
    q.add(late, 0.0)
    short = job(10, "s")
    q.add(short, 0.0)
    for t in range(50):
        run_once(q, short, float(t))
    assert q.tick(100.0) == [] and late.level >= 4


def test_a_running_job_is_preempted_only_by_a_job_ahead_even_after_the_switch_cost():
    slow_link = dataclasses.replace(cost(), kv_bytes_per_token=1e6, swap_bytes_per_s=1e6)
    q = GittinsQueue(slow_link, QUANTA)  # its KV's round trip: 2 s per token of context
    teach(q, 10, [30] * 40)
    running = job(50, "running")
    q.add(running, 0.0)
    run_once(q, running, 1.0)
    assert running.level > 0
    q.set_running([running])
    assert q.key(running)[0] == 0  # moving it costs more than it has left: not preempted
    no_lift = GittinsQueue(slow_link, QUANTA, lift=False)
    teach(no_lift, 10, [30] * 40)
    r2 = job(50, "r2")
    no_lift.add(r2, 0.0)
    run_once(no_lift, r2, 1.0)
    no_lift.set_running([r2])
    assert no_lift.key(r2)[0] == r2.level


def test_gittins_retunes_its_level_edges():
    assert DEFAULT_POLICY == "fsd" == resolve_policy("default")  # by the worst case
    q = make_queue(SchedConfig(policy="gittins"), cost())
    assert isinstance(q, GittinsQueue) and q.limits()[1:] == (None, None)
    teach(q, 10, [5] * 40)
    j = job(10, "j")
    q.add(j, 0.0)
    wider = make_queue(SchedConfig(policy="gittins", quanta=(100.0, 200.0)), cost())
    assert q.adopt(wider) and j.level == 0 and q.quanta == [100.0, 200.0]
    assert len(q.service.pooled) == 40  # what was learned stays


def test_a_simulated_job_gives_the_queue_no_cap_to_learn_its_length_from():
    from fsd.sim.job import SimJob

    sim = SimJob("s", 0.0, 100, 7)  # it ends after 7 tokens: max_output is the oracle
    assert sim.max_output == 7 and not ServiceRanks.has_prior(sim.params.max_tokens)
    q = GittinsQueue(cost(), QUANTA)
    q.add(sim, 0.0)
    twin = SimJob("t", 0.0, 100, 700)
    q.add(twin, 0.0)
    assert q._rank["s"] == q._rank["t"]  # noqa: SLF001 (the ranks themselves)
