"""One job's failure ends that job only: the engine loop and the other jobs go on.

Faults are injected into one job's sampling (its draw, and the batched pass), into
the model step of every batch that holds it, into the scheduler and into the step's
accounting. Each time the faulty job ends with reason "error" and a message, every
other job gets exactly the tokens of a fault-free run, every KV block comes back and
the engine serves a new job afterwards.
"""

from __future__ import annotations

import logging

import pytest

import fsd.engine.plan
import fsd.llm
from fsd import LLM, SamplingParams
from fsd.cost import CostModel
from fsd.engine.sampler import Sampler
from fsd.errors import ConfigError
from fsd.sched.decision import SchedulerOutput

PROMPTS = [[5, 6, 7], [9] * 12, [1, 2, 3, 4, 5], [200, 3, 64]]
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, seed=7)
PARAMS = [GREEDY, SEEDED, GREEDY, GREEDY]
BAD = 2  # the prompt whose job fails


def make_llm(tmp_path_factory, **options) -> LLM:
    path = tmp_path_factory.mktemp("profile") / "fixed.json"
    CostModel(name="fixed-test").save(path)
    llm = LLM("tiny", num_gpu_blocks=64, profile=str(path), **options)
    llm.engine.events.enabled = True
    return llm


@pytest.fixture(scope="module", params=[False, True], ids=["in-step", "ahead"])
def llm(tmp_path_factory, request) -> LLM:
    """Each fault both ways: the next step scheduled after this one's tokens, or ahead
    of them (fsd.engine.ahead: the model on a thread of its own here)."""
    return make_llm(tmp_path_factory, max_batch_size=8, schedule_ahead=request.param)


@pytest.fixture(scope="module")
def expected(llm) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)]


def assert_healthy(llm: LLM) -> None:
    """Every block is free, nothing is left behind, and a new job is served."""
    eng = llm.engine
    eng.blocks.check()
    assert eng.blocks.num_free == eng.blocks.device.num_blocks
    assert not eng.has_unfinished() and not eng.scheduler.has_unfinished()
    out = llm.generate([3, 1, 4], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4


def check_outcome(llm, outs, expected, bad: int, message: str, caplog) -> None:
    for i, (out, want) in enumerate(zip(outs, expected, strict=True)):
        if i == bad:
            assert out.finish_reason == "error"
            assert message in out.error
            assert out.token_ids == want[: len(out.token_ids)]  # its tokens until the fault
        else:
            assert out.finish_reason == "length" and out.error is None
            assert out.token_ids == want
    mine = {o.request_id for o in outs}
    ends = [e for e in llm.engine.events.drain() if e.kind == "finish" and e.job_id in mine]
    assert sorted(e.detail["reason"] for e in ends) == ["error"] + ["length"] * (len(outs) - 1)
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(logged) == 1 and outs[bad].request_id in logged[0].getMessage()
    assert_healthy(llm)


def test_a_failing_draw_ends_that_job_only(llm, expected, monkeypatch, caplog):
    params = list(PARAMS)
    params[BAD] = SamplingParams(**{**SEEDED.__dict__, "seed": 8})
    ref = llm.generate(PROMPTS[BAD], params[BAD])[0].token_ids  # seeded: the same alone
    expected = [*expected[:BAD], ref, *expected[BAD + 1 :]]
    real, draws = Sampler._generator_for, []

    def generator_for(self, job_id, params):  # its 3rd draw (counted: the model may run
        if llm.engine.get(job_id).prompt_token_ids == PROMPTS[BAD]:  # ahead of the host)
            draws.append(job_id)
            if len(draws) == 3:
                raise RuntimeError("injected draw fault")
        return real(self, job_id, params)

    monkeypatch.setattr(Sampler, "_generator_for", generator_for)
    caplog.set_level(logging.ERROR)
    outs = llm.generate(PROMPTS, params)
    assert len(outs[BAD].token_ids) == 2
    check_outcome(llm, outs, expected, BAD, "injected draw fault", caplog)


def test_a_failing_batched_sampling_pass_ends_that_job_only(llm, expected, monkeypatch, caplog):
    # An id past the logits raises IndexError in the batched pass; each row is then
    # sampled alone and only the row that still raises fails.
    bad_prompt = PROMPTS[BAD]
    real = fsd.engine.plan.banned_tokens

    def banned(job, eos_ids):
        if job.prompt_token_ids == bad_prompt and len(job.output_token_ids) == 3:
            return (10**9,)
        return real(job, eos_ids)

    monkeypatch.setattr(fsd.engine.plan, "banned_tokens", banned)
    caplog.set_level(logging.ERROR)
    outs = llm.generate(PROMPTS, PARAMS)
    assert len(outs[BAD].token_ids) == 3
    check_outcome(llm, outs, expected, BAD, "sampling failed: IndexError", caplog)


def test_a_failing_model_step_ends_that_job_only(llm, expected, monkeypatch, caplog):
    # Every model step over a batch holding the bad job raises once it has 2 tokens:
    # the executor re-runs the rest (a seeded job among them draws exactly once).
    eng = llm.engine
    worker = eng.executor.worker
    real = worker.launch
    bad_prompt = PROMPTS[BAD]

    def launch(plan, hidden=None):
        end = 0
        for job_id, n in zip(plan.job_ids, plan.query_lens, strict=True):
            end += n  # its last input: the position of its 2nd output token
            bad = eng.get(job_id).prompt_token_ids == bad_prompt
            if bad and plan.positions[end - 1] == len(bad_prompt) + 1:
                raise ValueError("injected forward fault")
        return real(plan, hidden)

    monkeypatch.setattr(worker, "launch", launch)
    caplog.set_level(logging.ERROR)
    outs = llm.generate(PROMPTS, PARAMS)
    assert len(outs[BAD].token_ids) == 2
    check_outcome(llm, outs, expected, BAD, "the model step failed: ValueError", caplog)


def test_a_raising_scheduler_fails_the_live_jobs_and_step_returns(llm, monkeypatch, caplog):
    eng = llm.engine
    jobs = [eng.add_request(p, GREEDY) for p in PROMPTS]
    eng.step()
    real = eng.scheduler.schedule

    def schedule(now, busy=()):
        raise KeyError("injected scheduler fault")

    monkeypatch.setattr(eng.scheduler, "schedule", schedule)
    caplog.set_level(logging.ERROR)
    deltas = eng.step()  # must not raise
    assert sorted(d.job_id for d in deltas) == sorted(j.job_id for j in jobs)
    for d in deltas:
        assert d.output.finish_reason == "error"
        assert "the scheduler failed: KeyError" in d.output.error
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    assert not eng.has_unfinished()
    monkeypatch.setattr(eng.scheduler, "schedule", real)
    assert_healthy(llm)


def test_a_failing_submit_fails_only_that_micro_batch(tmp_path_factory, monkeypatch):
    llm = make_llm(tmp_path_factory, max_batch_size=2, policy="fcfs")
    eng = llm.engine
    jobs = [eng.add_request(p, GREEDY) for p in PROMPTS]
    real = eng.executor.submit

    def submit(batch, sync_ops, async_ops):
        raise RuntimeError("injected submit fault")

    monkeypatch.setattr(eng.executor, "submit", submit)
    deltas = eng.step()
    failed = {d.job_id for d in deltas}
    assert len(failed) == 2
    assert all(d.output.error.startswith("submitting the step failed") for d in deltas)
    monkeypatch.setattr(eng.executor, "submit", real)
    done = {}
    while eng.has_unfinished():
        for d in eng.step():
            if d.output is not None:
                done[d.job_id] = d.output
    assert set(done) == {j.job_id for j in jobs} - failed
    assert all(o.finish_reason == "length" and len(o.token_ids) == 8 for o in done.values())
    assert_healthy(llm)


def test_a_failing_step_accounting_keeps_the_deltas_already_made(llm, monkeypatch):
    eng = llm.engine
    short = eng.add_request([7, 7], SamplingParams(max_tokens=1, ignore_eos=True))
    long = eng.add_request([8, 8], SamplingParams(max_tokens=5, ignore_eos=True))
    real = eng.scheduler.update

    def update(out, now):
        raise RuntimeError("injected update fault")

    monkeypatch.setattr(eng.scheduler, "update", update)
    deltas = eng.step()
    monkeypatch.setattr(eng.scheduler, "update", real)
    ends = {d.job_id: d.output for d in deltas if d.output is not None}
    assert ends[long.job_id].finish_reason == "error"
    assert "accounting the step failed" in ends[long.job_id].error
    if eng.executor.ahead:  # accounted before its tokens came: none was made yet
        assert ends[short.job_id].finish_reason == "error"
    else:
        assert ends[short.job_id].finish_reason == "length"  # finished before the fault
    assert_healthy(llm)


def test_fail_all_ends_every_live_job_and_frees_their_blocks(llm):
    eng = llm.engine
    jobs = [eng.add_request(p, GREEDY) for p in PROMPTS]
    eng.step()
    deltas = eng.fail_all("operator gave up")
    assert {d.job_id for d in deltas} == {j.job_id for j in jobs}
    assert all(d.output.error == "operator gave up" for d in deltas)
    assert eng.fail_all("again") == []
    assert_healthy(llm)


def test_a_refused_prompt_in_generate_leaves_no_job_behind(llm):
    with pytest.raises(ConfigError, match="empty"):
        llm.generate([[1, 2], [3, 4], []], GREEDY)
    assert not llm.engine.has_unfinished()
    assert_healthy(llm)


def test_a_stuck_scheduler_ends_generate_with_errors_not_an_exception(llm, monkeypatch):
    eng = llm.engine
    monkeypatch.setattr(fsd.llm, "_MAX_IDLE_STEPS", 5)
    real = eng.scheduler.schedule
    monkeypatch.setattr(eng.scheduler, "schedule", lambda now, busy=(): SchedulerOutput())
    outs = llm.generate(PROMPTS[:2], GREEDY)
    assert [o.finish_reason for o in outs] == ["error", "error"]
    assert all("no progress" in o.error for o in outs)
    monkeypatch.setattr(eng.scheduler, "schedule", real)
    assert_healthy(llm)
