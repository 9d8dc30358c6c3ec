"""Arrival processes: requested mean rate and CV, determinism, clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fsd.errors import ConfigError
from fsd.workload.arrivals import ArrivalProcess, empirical_rate_cv, gamma, make_arrivals, poisson

N = 200_000


@pytest.mark.parametrize(
    ("process", "cv_tol"),
    [
        (poisson(3.0), 0.03),
        (gamma(3.0, 0.5), 0.03),
        (gamma(3.0, 2.0), 0.03),
        (gamma(3.0, 4.0), 0.05),
        (gamma(3.0, 8.0), 0.08),
        (gamma(3.0, 16.0), 0.12),
    ],
)
def test_process_has_the_requested_rate_and_cv(process: ArrivalProcess, cv_tol: float):
    times = process.times(N, np.random.default_rng(7))
    rate, cv = empirical_rate_cv(times)
    # the mean gap's relative standard error is cv / sqrt(n); allow 4 of them
    assert rate == pytest.approx(process.rate, rel=4 * process.cv / math.sqrt(N))
    assert cv == pytest.approx(process.cv, rel=cv_tol)


def test_uniform_arrivals_are_evenly_spaced():
    times = make_arrivals("uniform", 4.0).times(5, np.random.default_rng(0))
    assert times.tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


def test_same_seed_same_times_other_seed_other_times():
    p = gamma(2.0, 4.0)
    a = p.times(1000, np.random.default_rng(3))
    b = p.times(1000, np.random.default_rng(3))
    c = p.times(1000, np.random.default_rng(4))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a[0] == 0.0 and np.all(np.diff(a) >= 0)


def test_a_rate_change_scales_the_same_draws():
    p = gamma(1.0, 2.0)
    a = p.times(100, np.random.default_rng(1))
    b = p.with_rate(4.0).times(100, np.random.default_rng(1))
    assert b == pytest.approx(a / 4.0)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: poisson(0.0), "rate must be > 0"),
        (lambda: poisson(float("nan")), "rate must be > 0"),
        (lambda: gamma(1.0, -1.0), "cv must be >= 0"),
        (lambda: gamma(1.0, 0.0), "gamma process needs cv > 0"),
        (lambda: make_arrivals("poisson", 1.0, 2.0), "poisson process has cv 1"),
        (lambda: make_arrivals("weibull", 1.0), "arrival must be one of poisson, gamma, uniform"),
    ],
)
def test_bad_parameters_name_the_field(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_negative_count_is_refused():
    with pytest.raises(ConfigError, match="number of requests"):
        poisson(1.0).gaps(-1, np.random.default_rng(0))
