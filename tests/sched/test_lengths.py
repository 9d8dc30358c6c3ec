"""The Gittins demotion rule: hand-computed indices and what MLFQ does with them."""

from __future__ import annotations

import pytest

from fsd.config import CacheConfig, SchedConfig
from fsd.errors import ConfigError
from fsd.jobs import FinishReason, Job, SamplingParams
from fsd.sched.lengths import OutputLengthIndex
from fsd.sched.mlfq import MLFQQueue
from fsd.sched.registry import check_policies
from tests.sched.test_mlfq import QUANTA, cost, run_once


def finished(n_out: int, reason: FinishReason = FinishReason.LENGTH, name: str = "f") -> Job:
    j = Job(prompt_token_ids=[1], params=SamplingParams(max_tokens=n_out), job_id=name)
    j.output_token_ids.extend([0] * n_out)
    j.finish(reason, 0.0)
    return j


def index_of(samples: list[int], **kw: int) -> OutputLengthIndex:
    idx = OutputLengthIndex(**kw)
    for s in samples:
        idx.observe(s)
    return idx


def test_alike_outputs_raise_the_index_with_progress():
    idx = index_of([20] * 32)
    # one length: the best horizon is the rest of it; a completion is worth 1/20 (the
    # per-token latency weight) and costs 20 - a tokens: G(a) = 1 / (20 (20 - a))
    assert idx.index(0) == pytest.approx(1 / 400)
    assert idx.index(10) == pytest.approx(1 / 200)
    assert idx.keeps_level(10) and not idx.keeps_level(0)


def test_a_long_tail_lowers_the_index_of_a_job_that_outlived_the_short_ones():
    idx = index_of([1] * 16 + [100] * 16)
    # G(0): horizon 1 finishes half of them (weight 1 each) at a cost of 1 token each: 0.5
    assert idx.index(0) == pytest.approx(0.5)
    # past 1 token only the 100s remain: a completion worth 1/100 per 99 tokens
    assert idx.index(1) == pytest.approx(1 / 9900)
    assert not idx.keeps_level(1)


def test_mixed_horizon_is_the_supremum_over_sample_points():
    idx = index_of([2, 6] * 16)
    # horizon 2: half finish (worth 1/2 each) for 2 tokens each: (1/4) / 2 = 1/8;
    # horizon 6: all finish, worth (1/2 + 1/6) / 2 = 1/3 for 4 tokens each: 1/12
    assert idx.index(0) == pytest.approx(1 / 8)
    assert idx.index(2) == pytest.approx(1 / 24)  # only the 6s are left, 4 tokens to go
    assert not idx.keeps_level(2)


def test_outliving_every_sample_gives_zero():
    assert index_of([5] * 32).index(5) == 0.0


def test_before_enough_jobs_finished_the_caps_decide():
    idx = index_of([1] * 16 + [100] * 15, min_samples=32)
    # no caps known (the simulator's jobs): the uniform prior, progress keeps the place
    assert not idx.ready and idx.keeps_level(10) and not idx.keeps_level(0)
    # one cap: as FCFS; a long job near its end behind short ones waiting: demoted
    assert idx.keeps_level(10, cap=64, fresh_cap=64)
    assert not idx.keeps_level(435, cap=512, fresh_cap=8)
    assert idx.keeps_level(510, cap=512, fresh_cap=8)  # 2 left: still ahead of 8
    idx.observe(100)
    # learned now: 10 tokens in, only the 100s remain, far behind a fresh job
    assert idx.ready and not idx.keeps_level(10) and not idx.keeps_level(10, 64, 64)


def test_the_window_forgets_old_lengths():
    idx = index_of([1] * 16 + [100] * 16, window=32, refresh=1)
    assert not idx.keeps_level(50)
    for _ in range(32):
        idx.observe(100)  # the workload changed: every output is 100 tokens now
    assert idx.index(0) == pytest.approx(1e-4) and idx.keeps_level(50)


def test_bad_window_is_refused():
    with pytest.raises(ValueError, match="window"):
        OutputLengthIndex(window=0)


def gittins_queue(samples: list[int]) -> MLFQQueue:
    q = MLFQQueue(cost(decode=1.0), QUANTA, starve_limit=100.0, demote_rule="gittins")
    for i, n in enumerate(samples):
        q.remove(finished(n, name=f"f{i}"))
    return q


def fresh(name: str) -> Job:
    return Job(prompt_token_ids=[1] * 4, params=SamplingParams(max_tokens=100), job_id=name)


def test_finished_jobs_teach_the_queue_and_aborted_ones_do_not():
    q = gittins_queue([20] * 10)
    q.remove(finished(3, FinishReason.ABORT, "a"))
    q.remove(finished(3, FinishReason.ERROR, "e"))
    assert len(q.lengths) == 10


def test_a_job_closer_to_done_than_a_fresh_one_keeps_its_level_and_place():
    q = gittins_queue([20] * 32)
    a, b = fresh("a"), fresh("b")
    q.add(a, 0.0)  # prefill 1.04 -> Q2 (q=2)
    q.add(b, 0.0)
    assert a.level == b.level == 1
    run_once(q, a, 1.0)  # the prefill is free
    assert run_once(q, a, 2.0) == []  # 1 decode: attained 1 < 2
    # the quantum is spent with 2 of 20 tokens out: G(2) = 1/360 > G(0) = 1/400
    assert run_once(q, a, 3.0) == []
    assert a.level == 1 and a.attained == 0.0 and a.demotions == 0
    assert list(q.ordered()) == [a, b]  # still ahead of the job that came after it


def test_a_fresh_queue_keeps_a_job_whose_quantum_ran_out():
    q = gittins_queue([])
    a, b = fresh("a"), fresh("b")
    q.add(a, 0.0)
    q.add(b, 0.0)
    for t in (1.0, 2.0, 3.0):
        assert run_once(q, a, t) == []
    assert a.level == 1 and a.demotions == 0 and list(q.ordered()) == [a, b]


def test_a_fresh_queue_demotes_a_long_job_that_short_arrivals_wait_behind():
    # the live scene: a long job (cap 512) 3 tokens from its quantum's end, a short
    # one (cap 8) waiting; nothing learned yet: the long one expects far more left
    q = gittins_queue([])
    long = Job(prompt_token_ids=[1] * 4, params=SamplingParams(max_tokens=512), job_id="l")
    short = Job(prompt_token_ids=[1] * 4, params=SamplingParams(max_tokens=8), job_id="s")
    q.add(long, 0.0)
    q.add(short, 0.0)
    demoted = [run_once(q, long, t) for t in (1.0, 2.0, 3.0)]
    assert [long] in demoted and list(q.ordered())[0] is short


def test_a_job_past_the_short_outputs_is_demoted_as_usual():
    q = gittins_queue([1] * 16 + [100] * 16)
    a = fresh("a")
    q.add(a, 0.0)
    for t in (1.0, 2.0):
        run_once(q, a, t)
    assert run_once(q, a, 3.0) == [a] and a.level == 2


def test_the_always_rule_and_naive_mlfq_ignore_the_lengths():
    for q in (
        MLFQQueue(cost(decode=1.0), QUANTA, starve_limit=100.0, demote_rule="always"),
        MLFQQueue(cost(decode=1.0), QUANTA, 100.0, skip_join=False, demote_rule="gittins"),
    ):
        for i in range(32):
            q.remove(finished(20, name=f"f{i}"))
        a = fresh("a")
        q.add(a, 0.0)
        demoted = [run_once(q, a, float(t)) for t in range(1, 4)]
        assert [a] in demoted


def test_unknown_demote_rule_is_refused():
    with pytest.raises(ConfigError, match="fsd setting demote must be one of"):
        check_policies(SchedConfig(policy_settings={"fsd.demote": "never"}), CacheConfig())


def test_retune_switches_the_rule_and_keeps_what_was_learned():
    q = gittins_queue([20] * 32)
    q.adopt(MLFQQueue(cost(decode=1.0), QUANTA, starve_limit=100.0, demote_rule="always"))
    assert q.demote_rule == "always" and q.lengths.ready
    a = fresh("a")
    q.add(a, 0.0)
    assert [a] in [run_once(q, a, float(t)) for t in range(1, 4)]  # demoted now
