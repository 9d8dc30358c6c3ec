"""The twin's forward runs: the proposal is applied, the draws are shared, the future
is drawn from what the engine recorded."""

from __future__ import annotations

import dataclasses

import pytest

from fsd import LLM, SamplingParams
from fsd.engine.history import ArrivalFit
from fsd.errors import SettingError
from fsd.twin.forward import preview, run_twin
from fsd.twin.snapshot import TwinSnapshot, take_snapshot


@pytest.fixture(scope="module")
def snap() -> TwinSnapshot:
    eng = LLM("tiny", num_gpu_blocks=64, num_host_blocks=256, max_batch_size=6).engine
    for i in range(10):  # half run to their limit, half may stop at EOS: drawn lengths
        params = SamplingParams(max_tokens=40 + 10 * i, ignore_eos=i % 2 == 0)
        eng.add_request([1 + (i * 7 + k) % 200 for k in range(20 + 9 * i)], params)
    for _ in range(6):
        eng.step()
    for prompt, out in [(30, 12), (80, 70), (50, 200), (40, 5)]:  # finished jobs' lengths
        eng.history.finished.append((prompt, out, True))
    s = take_snapshot(eng.scheduler, eng.history, eng.config.sched, eng.config.cache, 0.5)
    return dataclasses.replace(s, arrivals=ArrivalFit(rate=2.0, cv=1.5, window=60.0, seen=120))


def test_a_no_op_proposal_predicts_exactly_the_current_future(snap: TwinSnapshot) -> None:
    rep = preview(snap, {"policy": snap.sched.policy}, horizon=20.0, seeds=2)
    assert rep.current == rep.proposed
    assert rep.assumptions.live_jobs == 10 and rep.assumptions.sampled_remaining == 5
    assert rep.assumptions.arrival_rate == 2.0 and rep.assumptions.lengths_from == 4
    assert rep.current.finished.mean > 0


def test_the_proposal_is_applied_to_the_twin_only(snap: TwinSnapshot) -> None:
    _, _, now = run_twin(snap, None, 20.0, seed=1)
    live, _, one = run_twin(snap, {"max_batch_size": 1}, 20.0, seed=1)
    assert now.counters.batched_jobs > now.counters.iterations  # batches of several
    assert one.counters.batched_jobs == one.counters.iterations  # one job at a time
    assert live[0].job_id.startswith("job-")


def test_the_future_is_drawn_from_what_was_recorded(snap: TwinSnapshot) -> None:
    live, arrivals, _ = run_twin(snap, None, 30.0, seed=3)
    assert arrivals, "a fitted rate of 2/s draws arrivals over 30 s"
    recorded = {(p, o) for p, o, _ in snap.lengths}  # (ours, and any the engine finished)
    assert {(30, 12), (80, 70), (50, 200), (40, 5)} <= recorded
    assert {(j.prompt_len, j.max_output) for j in arrivals} <= recorded
    assert all(snap.taken_at < j.arrival_time <= snap.taken_at + 30.0 for j in arrivals)
    limits = {lj.job_id: lj for lj in snap.live}
    for job in live:
        lj = limits[job.job_id]
        if lj.exact:
            assert job.max_output == lj.max_output
        else:  # drawn from the recorded outputs longer than what it has, within its limit
            assert lj.generated < job.max_output <= lj.max_output
            assert job.max_output in {o for _, o in recorded} | {lj.max_output}


def test_a_proposal_is_refused_as_a_retune_would_be(snap: TwinSnapshot) -> None:
    with pytest.raises(SettingError, match="unknown setting teleport"):
        preview(snap, {"teleport": 1}, horizon=10.0, seeds=1)
    with pytest.raises(SettingError):
        preview(snap, {"max_batch_size": -3}, horizon=10.0, seeds=1)
