"""Live cost (fsd.cost.calibration): service charged in measured seconds.

The estimator first (steady ratio, bad samples, outliers), then the scheduler: a
machine 100x slower than its profile charges long jobs 100x the service, so they use
up their quanta and sink through the levels in proportionally fewer iterations
instead of sitting at their level. The simulator never measures: its scale stays 1.0.
"""

from __future__ import annotations

import math

import pytest

from fsd.cost.calibration import MAX_RATIO, MIN_RATIO, LiveCost
from fsd.jobs import Job, SamplingParams
from fsd.sched.scheduler import Scheduler
from fsd.sim import simulate
from fsd.workload import Request, Workload
from tests.costs import linear_cost
from tests.sched.harness import scheduler

# a decode step costs 1 s whatever the batch; quanta 1, 2, 4, ... 128 (q1 = 1 s, 8 levels)
UNIT = linear_cost("unit", prefill=(1.0, 0.01), decode=(1.0, 0.0, 0.0), kv_bytes_per_token=1)


# ---- the estimator ---------------------------------------------------------------


def test_the_scale_is_exactly_one_before_any_sample():
    live = LiveCost()
    assert live.scale == 1.0 and live.samples == 0 and live.last_ratio is None
    assert 0.1 * live.scale == 0.1  # (what the simulator relies on: x * 1.0 is x)


def test_a_steady_ratio_is_learned_from_the_first_sample_and_kept():
    live = LiveCost()
    assert live.observe(0.01, 1.0)  # 100x slower
    assert live.scale == pytest.approx(100.0)  # bias-corrected: not pulled towards 1.0
    for _ in range(50):
        live.observe(0.02, 2.0)
    assert live.scale == pytest.approx(100.0) and live.samples == 51


def test_it_follows_a_machine_that_gets_busy():
    live = LiveCost()
    for _ in range(20):
        live.observe(0.01, 0.01)
    assert live.scale == pytest.approx(1.0)
    seen = []
    for _ in range(60):
        live.observe(0.01, 0.5)  # 50x slower from now on
        seen.append(live.scale)
    assert all(a <= b for a, b in zip(seen, seen[1:], strict=False))  # it only rises
    assert seen[0] < 3.0  # one sample is not a new regime
    assert seen[-1] == pytest.approx(50.0, rel=0.05)  # ten-odd samples later it is


@pytest.mark.parametrize(
    ("predicted", "measured"),
    [
        (0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, -2.0), (math.nan, 1.0), (1.0, math.nan),
        (math.inf, 1.0), (1.0, math.inf), (5e-324, 1e308),  # the division overflows
    ],
)  # fmt: skip
def test_samples_that_say_nothing_are_ignored(predicted, measured):
    live = LiveCost()
    live.observe(0.01, 0.04)
    assert not live.observe(predicted, measured)
    assert live.scale == pytest.approx(4.0) and live.samples == 1


def test_one_outlier_moves_the_scale_by_a_bounded_factor():
    live = LiveCost()
    for _ in range(30):
        live.observe(0.01, 0.02)
    live.observe(0.01, 1e9)  # a sleeping laptop: clamped to MAX_RATIO, then weighted
    assert live.last_ratio == pytest.approx(1e11)
    # at most (clamped ratio / scale) ** weight, the weight a bit over 0.1 (bias-corrected)
    assert 2.0 < live.scale < 2.0 * (MAX_RATIO / 2.0) ** (1.1 * live.weight) < 4.0
    live.reset()
    live.observe(1.0, 1e-9)  # absurdly fast: clamped to MIN_RATIO
    assert live.scale == pytest.approx(MIN_RATIO)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="weight"):
        LiveCost(weight=0.0)
    with pytest.raises(ValueError, match="min_ratio"):
        LiveCost(min_ratio=2.0)


# ---- the scheduler -----------------------------------------------------------------


def long_job() -> Job:
    return Job(prompt_token_ids=[5] * 8, params=SamplingParams(max_tokens=4000), job_id="long")


def iterations_per_level(sched: Scheduler, slowdown: float | None, n: int) -> dict[int, int]:
    """Run one long job `n` iterations; how many it spent at each level.

    `slowdown`: each iteration is reported to have taken that many times the
    prediction (None: nothing is measured, as in the simulator).
    """
    job = long_job()
    sched.add(job, 0.0)
    spent: dict[int, int] = {}
    now = 0.0
    for _ in range(n):
        out = sched.schedule(now)
        assert out.batch == [job]
        level = job.level
        job.append_token(1, now) if job.step_samples else job.absorb_chunk()
        if slowdown is not None:
            predicted = sched.predicted_iteration_time
            sched.observe_iteration(predicted, slowdown * predicted)
        now += 1.0
        sched.update(out, now)
        spent[level] = spent.get(level, 0) + 1
    return spent


def test_a_100x_slower_machine_charges_100x_and_long_jobs_sink_100x_sooner():
    # fsd.demote "always": the quantum's end alone decides (no learned lengths yet)
    always = {"demote": "always"}
    plain = iterations_per_level(scheduler("fsd", cost=UNIT, rules=always, device=512), None, 300)
    sched = scheduler("fsd", cost=UNIT, rules=always, device=512)
    slow = iterations_per_level(sched, 100.0, 300)
    assert sched.live_cost.scale == pytest.approx(100.0)
    assert sched.stats().live_cost == pytest.approx(100.0)
    assert sched.stats().live_cost_samples == 300
    quanta = sched.queue.limits()[0]
    last = len(quanta) - 1
    entry = min(slow)  # skip-join's level; its first iteration, the prefill, is not charged
    assert entry == min(plain) < last
    # without calibration: a level of quantum q holds the job q decode steps of 1 s
    assert plain[entry] == 1 + quanta[entry]
    assert all(plain[level] == quanta[level] for level in range(entry + 1, last))
    # with it: each step is charged 100 s, so every quantum up to 100 s lasts one step
    assert slow[entry] == 1 + 1
    assert all(slow[level] == 1 for level in range(entry + 1, last))
    to_last = [sum(run[lv] for lv in range(entry, last)) for run in (slow, plain)]
    assert to_last[0] * 10 < to_last[1]  # iterations until the last level: 7 against 127
    assert slow[last] > 280  # it reached the last level within a few iterations


def test_the_charge_is_the_prediction_times_the_scale():
    sched = scheduler("fsd", cost=UNIT, rules={"demote": "always"}, num_levels=2,
                      quanta=(1000.0, 2000.0))  # fmt: skip
    job = long_job()
    sched.add(job, 0.0)
    for i in range(3):  # the prefill (not charged at the skip-join level), two decodes
        out = sched.schedule(float(i))
        job.append_token(1, float(i))
        sched.observe_iteration(2.0, 8.0)  # 4x slower
        sched.update(out, float(i + 1))
    assert job.attained == pytest.approx(2 * 4.0 * UNIT.job_iteration_time(1, job.num_tokens))


def test_the_simulator_never_measures_so_its_scale_stays_exactly_one():
    work = Workload(tuple(Request(0.1 * i, 20, 30) for i in range(12)))
    result = simulate(work, UNIT, "sj-mlfq", num_gpu_blocks=256)
    assert result.scheduler is not None
    live = result.scheduler.live_cost
    assert live.samples == 0 and live.scale == 1.0
    assert result.scheduler.stats().live_cost == 1.0
