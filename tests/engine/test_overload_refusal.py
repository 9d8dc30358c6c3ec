"""Overload refusal (SchedConfig.refuse_late, off by default): a request predicted to
miss the SLO by the given factor is refused with "overloaded"; nothing else changes."""

from __future__ import annotations

import pytest

from fsd import LLM, SamplingParams
from fsd.errors import OverloadedError
from fsd.sched.slo import default_slo

ONE = SamplingParams(max_tokens=1, ignore_eos=True)


def _fill(llm: LLM, count: int) -> tuple[list[str], int]:
    """Queue `count` one-token jobs without running any; (accepted ids, refusals)."""
    accepted, refused = [], 0
    for i in range(count):
        try:
            accepted.append(llm.engine.add_request(f"job {i}", ONE).job_id)
        except OverloadedError as exc:
            assert exc.code == "overloaded" and "refuse_late" in str(exc)
            refused += 1
    return accepted, refused


def test_a_request_predicted_late_is_refused_and_the_queued_ones_run():
    llm = LLM("tiny", max_batch_size=1, refuse_late=0.5, num_gpu_blocks=256, seed=1)
    try:
        llm.engine.events.enabled = True
        engine = llm.engine
        # each job ahead at its level adds a quantum over a batch of one: the predicted
        # latency passes half the SLO after a few of them
        accepted, refused = _fill(llm, 30)
        assert accepted and refused and len(accepted) + refused == 30
        assert engine.refused_late == refused
        queued = [j.job_id for j in engine.scheduler.jobs()]
        assert sorted(queued) == sorted(accepted)  # a refused job left nothing behind
        kinds = [e.kind for e in engine.events.drain()]
        assert kinds.count("refuse") == refused
        # the first refusal came once the prediction crossed the bound, and the queue
        # ahead of each accepted job was shorter than the one ahead of the first refused
        slo = default_slo(engine.cost)
        job = engine.scheduler.get(accepted[-1])
        assert job is not None
        assert engine.scheduler.predicted_latency(job, 0.0) <= 0.5 * slo
        finished = set()
        while engine.has_unfinished():
            finished |= {d.job_id for d in engine.step() if d.finished}
        assert finished == set(accepted)
        # once the queue drained, a request is accepted again
        again, refused_now = _fill(llm, 1)
        assert len(again) == 1 and refused_now == 0
    finally:
        llm.close()


def test_off_by_default_nothing_is_refused():
    llm = LLM("tiny", max_batch_size=1, num_gpu_blocks=256, seed=1)
    try:
        assert llm.engine.config.sched.refuse_late is None
        accepted, refused = _fill(llm, 40)
        assert len(accepted) == 40 and refused == 0
    finally:
        llm.close()


@pytest.mark.parametrize("value", [0, -1.0, 1e7, float("nan")])
def test_refuse_late_out_of_range_is_a_clear_error(value):
    from fsd.config import SchedConfig
    from fsd.errors import ConfigError

    with pytest.raises(ConfigError, match="refuse_late"):
        SchedConfig(refuse_late=value)


def test_a_request_predicted_to_wait_too_long_for_its_first_token_is_refused_with_a_hint():
    from fsd.sched.first_tokens import MIN_STARTS

    # fcfs and a batch of one: a queued job waits for every one before it
    llm = LLM("tiny", policy="fcfs", max_batch_size=1, refuse_wait=1e-6, num_gpu_blocks=256)
    try:
        engine = llm.engine
        # nothing measured yet: no prediction, nothing refused
        for i in range(MIN_STARTS):
            engine.add_request(f"warm {i}", ONE)
        while engine.has_unfinished():
            engine.step()
        # measured now: a job with none before it is taken, the next is predicted to
        # wait for it, longer than the bound
        first = engine.add_request("first", ONE)
        with pytest.raises(OverloadedError) as err:
            engine.add_request("second", ONE)
        exc = err.value
        assert exc.code == "overloaded" and "refuse_wait" in str(exc)
        assert exc.retry_after is not None and exc.retry_after >= 1
        assert f"retry after {exc.retry_after:g} s" in str(exc)
        assert [j.job_id for j in engine.scheduler.jobs()] == [first.job_id]
        assert engine.refused_late == 1
        while engine.has_unfinished():
            engine.step()
        # drained: taken again
        engine.add_request("third", ONE)
    finally:
        llm.close()


@pytest.mark.parametrize("value", [0, -1.0, 1e6, float("nan"), float("inf")])
def test_refuse_wait_out_of_range_is_a_clear_error(value):
    from fsd.config import SchedConfig
    from fsd.errors import ConfigError

    with pytest.raises(ConfigError, match="refuse_wait"):
        SchedConfig(refuse_wait=value)
