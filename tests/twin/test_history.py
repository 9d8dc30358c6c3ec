"""What the twin fits: arrival rate and CV, the iteration clock, recent lengths."""

from __future__ import annotations

import numpy as np
import pytest

from fsd.engine.history import WorkHistory
from fsd.jobs import FinishReason, Job, SamplingParams
from tests.import_graph import loads


def _history(gaps: np.ndarray, start: float = 0.0) -> tuple[WorkHistory, float]:
    h = WorkHistory(start)
    t = start
    for g in gaps:
        t += g
        h.arrived(t)
    return h, t


@pytest.mark.parametrize(("rate", "cv"), [(5.0, 1.0), (2.0, 3.0), (20.0, 0.5)])
def test_the_arrival_fit_recovers_rate_and_burstiness(rate: float, cv: float) -> None:
    rng = np.random.default_rng(1)
    shape = 1 / cv**2
    h, end = _history(rng.gamma(shape, 1 / rate / shape, 3000))
    fit = h.arrival_fit(end, window=end)  # every arrival in the window
    assert fit.rate == pytest.approx(rate, rel=0.1)
    assert fit.cv == pytest.approx(cv, rel=0.15)
    assert fit.seen == 3000


def test_a_young_daemon_counts_from_its_first_arrival_and_an_idle_one_assumes_none() -> None:
    h = WorkHistory(0.0)
    for t in np.arange(100.0, 150.0, 0.5):  # idle for 100 s, then 2 per second
        h.arrived(float(t))
    fit = h.arrival_fit(150.0, window=300.0)
    assert fit.rate == pytest.approx(2.0, rel=0.02) and fit.cv == pytest.approx(0.0, abs=1e-6)
    idle = WorkHistory(0.0).arrival_fit(60.0)
    assert idle.rate == 0.0 and idle.seen == 0
    old = h.arrival_fit(1000.0, window=300.0)  # the arrivals are older than the window
    assert old.rate == 0.0


def test_the_clock_fits_scale_and_overhead_and_ignores_stalls() -> None:
    h = WorkHistory(0.0)
    assert h.clock().samples == 0 and h.clock()(0.1) == pytest.approx(0.1)
    t = 0.0
    rng = np.random.default_rng(0)
    for i in range(200):
        pred = float(rng.uniform(0.01, 0.05))
        wall = 2.0 * pred + 0.004
        if i == 50:
            wall = 3.0  # a stall (a GC pause, a page fault): not the regime
        h.stepped(t, t + wall * 0.8, pred, ran=True, busy=True)
        t += wall
    clock = h.clock()
    assert clock.scale == pytest.approx(2.0, rel=0.02)
    assert clock.overhead == pytest.approx(0.004, abs=5e-4)
    assert clock.samples == 198  # the last step's successor never came; one stall dropped


def test_a_step_before_idle_counts_its_own_duration_and_an_empty_one_nothing() -> None:
    h = WorkHistory(0.0)
    h.stepped(0.0, 0.05, 0.02, ran=True, busy=False)  # the queue ran dry after it
    h.stepped(10.0, 10.01, 0.0, ran=False, busy=True)  # nothing ran (copies only)
    assert list(h.steps) == [(0.02, pytest.approx(0.05))]


def test_only_jobs_that_finished_lend_their_lengths() -> None:
    h = WorkHistory(0.0)
    for reason, n in [(FinishReason.STOP, 3), (FinishReason.LENGTH, 5), (FinishReason.ABORT, 2),
                      (FinishReason.ERROR, 1)]:  # fmt: skip
        job = Job([1] * 7, SamplingParams(max_tokens=5))
        job.output_token_ids = [2] * n
        job.finish(reason, 1.0)
        h.ended(job)
    assert h.lengths() == [(7, 3, True), (7, 5, False)]


def test_the_twin_and_the_engines_history_load_without_torch():
    """The preview process imports the twin, and of the engine only its step history."""
    twin = ("fsd.twin.snapshot", "fsd.twin.forward", "fsd.twin.worker")
    assert not loads("torch", "fsd.engine.history", *twin)
