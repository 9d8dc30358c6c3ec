"""Chunked prefill's scheduling rules: the per-iteration budget, decodes first, how
chunks count toward the quantum, ENST, SRPT, and the budget derived from the SLO."""

from __future__ import annotations

import pytest

from fsd.config import ConfigError, SchedConfig
from fsd.sched.chunking import prefill_budget
from fsd.sched.slo import default_slo
from tests.costs import linear_cost
from tests.sched.harness import COST, drive, make_jobs, scheduler


def _step(sched, now: float = 0.0):
    """One decision and its outcome, as the engine and the simulator apply it."""
    out = sched.schedule(now)
    for job in out.batch:
        if not job.step_samples:
            job.absorb_chunk()
            continue
        job.append_token(1, now)
        reason, _ = job.stop_after(1, (), 1 << 62)
        if reason is not None:
            job.finish(reason, now)
    sched.update(out, now + 1.0)  # removes the finished jobs
    sched.blocks.check()
    return out


def test_an_iteration_carries_at_most_the_budget_of_prompt_tokens_in_all():
    sched = scheduler("fcfs", device=256, block_size=4, prefill_chunk=64)
    for job in make_jobs([(150, 3), (150, 3), (40, 3)]):
        sched.add(job, 0.0)
    steps = []
    while sched.has_unfinished():
        out = _step(sched)
        prefill = sum(j.step_tokens for j in out.batch if j.step_tokens > 1)
        assert prefill <= 64
        steps.append([(j.job_id, j.step_tokens) for j in out.batch])
    # fcfs: the first prompt takes the whole budget, then the next one what is left
    assert steps[0] == [("j0", 64)]
    assert steps[2] == [("j0", 22), ("j1", 42)]


def test_chunks_leave_every_ready_decode_its_token():
    # 3 decoding jobs, then a long prompt: each chunk gets the budget minus their tokens
    sched = scheduler("fcfs", device=512, block_size=4, max_batch_tokens=40, prefill_chunk=64)
    decoders = make_jobs([(8, 50)] * 3, "d")
    for job in decoders:
        sched.add(job, 0.0)
    _step(sched)
    long_job = make_jobs([(200, 2)], "p")[0]
    sched.add(long_job, 1.0)
    while long_job.num_output_tokens == 0:
        out = _step(sched)
        ids = {j.job_id for j in out.batch}
        assert {"d0", "d1", "d2"} <= ids  # no decode skipped while the prompt fills
        assert long_job.step_tokens <= 40 - 3
    assert long_job.num_computed_tokens == 200


def test_chunks_change_no_level_or_service_whether_prefill_is_charged_or_not():
    # the chunks of a prompt are charged their shares of the whole prefill: under
    # sj-mlfq.charge_prefill they add up to exactly the whole one's charge, otherwise to nothing
    for charge in (False, True):
        seen = []
        for chunk in (0, 32):
            sched = scheduler("sj-mlfq", device=512, block_size=4, prefill_chunk=chunk,
                              rules={"charge_prefill": charge})  # fmt: skip
            job = make_jobs([(100, 3)])[0]
            sched.add(job, 0.0)
            charged, steps = 0.0, 0
            while not job.output_token_ids:
                _step(sched)
                charged += job.last_cost
                steps += 1
            assert steps == (1 if chunk == 0 else 4)  # 32 + 32 + 32 + 4 tokens
            assert charged == pytest.approx(COST.prefill_time(100))
            seen.append((job.level, job.attained, job.demotions))
        assert seen[0] == pytest.approx(seen[1])


def test_skip_join_places_a_job_by_its_whole_prompt_whatever_the_chunk():
    cost = linear_cost("c", prefill=(0.0, 1.0), decode=(1.0, 0.0, 0.0))
    whole = scheduler("sj-mlfq", cost=cost, prefill_chunk=0)
    chunked = scheduler("sj-mlfq", cost=cost, prefill_chunk=16)
    a, b = make_jobs([(40, 2), (40, 2)])
    whole.add(a, 0.0)
    chunked.add(b, 0.0)
    assert a.level == b.level > 0


def test_enst_counts_the_prefill_a_partly_prefilled_job_above_has_left():
    cost = linear_cost("c", prefill=(0.0, 0.01), decode=(1.0, 0.0, 0.0))
    sched = scheduler("sj-mlfq", cost=cost, device=512, block_size=4, prefill_chunk=16,
                      max_batch_size=1)  # fmt: skip
    long_job, low = make_jobs([(200, 5), (8, 400)])
    sched.add(long_job, 0.0)
    _step(sched)  # its first chunk
    assert 0 < long_job.num_computed_tokens < 200
    sched.add(low, 0.0)
    low.level = long_job.level + 1  # a job below it
    sched.queue._place(low, low.level)
    sched.schedule(1.0)
    sched.refresh_enst()
    left = cost.chunk_time(200 - 16, 16)
    without = sched.queue.enst_fn(1.0, 1)(low)
    assert sched.enst_of(low) == pytest.approx(without + left)  # (its promotion is far off)


def test_srpt_counts_the_rest_of_a_partial_prefill():
    sched = scheduler("srpt", device=512, block_size=4, prefill_chunk=16)
    job = make_jobs([(100, 3)])[0]
    sched.add(job, 0.0)
    _step(sched)
    assert job.num_computed_tokens == 16
    decode = COST.decode_base + COST.decode_per_seq + COST.decode_per_ctx_token * 100
    assert sched.queue.remaining_time(job) == pytest.approx(COST.chunk_time(84, 16) + 2 * decode)


def test_the_harness_finishes_every_job_with_chunks_and_a_small_pool():
    sched = scheduler("sj-mlfq", "proactive", device=40, host=200, block_size=4,
                      prefill_chunk=16, max_batch_size=4)  # fmt: skip
    jobs = make_jobs([(60, 6), (9, 20), (33, 4), (70, 3), (5, 30), (48, 8)])
    run = drive(sched, jobs, arrivals={"j3": 2, "j4": 3, "j5": 5})
    assert sorted(run.finished) == sorted(j.job_id for j in jobs)
    assert all(j.num_output_tokens == j.max_output for j in jobs)
    assert sched.blocks.device.num_free == 40 and sched.blocks.host.num_free == 200


def test_the_default_budget_is_the_most_prompt_tokens_whose_prefill_fits_the_slo():
    cost = linear_cost("c", prefill=(0.001, 0.0001), decode=(0.002, 0.0, 0.0))
    slo = default_slo(cost)
    budget = prefill_budget(None, cost, 16)
    assert budget % 16 == 0
    assert cost.prefill_time(budget) <= slo < cost.prefill_time(budget + 16)
    assert prefill_budget(0, cost, 16) == 0 and prefill_budget(48, cost, 16) == 48
    # a profile whose every prefill exceeds the SLO still chunks by one block
    slow = linear_cost("s", prefill=(1.0, 1.0), decode=(0.001, 0.0, 0.0))
    assert prefill_budget(None, slow, 16) == 16
    assert scheduler(prefill_chunk=None).prefill_budget == prefill_budget(None, COST, 4)


def test_a_partial_budget_is_refused_with_the_field_named():
    with pytest.raises(ConfigError, match="prefill_chunk"):
        SchedConfig(prefill_chunk=-1)
    with pytest.raises(ConfigError, match="prefill_chunk"):
        SchedConfig(prefill_chunk="512")  # type: ignore[arg-type]
