"""Workloads: synthetic generation for a seed and the transformations sweeps use."""

from __future__ import annotations

import pytest

from fsd.errors import ConfigError
from fsd.workload import Request, Workload, gamma, length_model, poisson, synthetic


def test_synthetic_is_a_pure_function_of_the_seed():
    a = synthetic(gamma(2.0, 4.0), length_model("sharegpt"), 300, seed=11)
    b = synthetic(gamma(2.0, 4.0), length_model("sharegpt"), 300, seed=11)
    c = synthetic(gamma(2.0, 4.0), length_model("sharegpt"), 300, seed=12)
    assert a.requests == b.requests
    assert a.requests != c.requests
    assert a.params["seed"] == 11 and a.params["cv"] == 4.0
    assert all(r.prompt_len + r.output_len <= 2048 for r in a)


def test_scaled_multiplies_the_rate():
    w = synthetic(poisson(1.0), length_model("alpaca"), 100, seed=0)
    fast = w.scaled(4.0)
    assert fast.rate == pytest.approx(4 * w.rate)
    assert [r.prompt_len for r in fast] == [r.prompt_len for r in w]
    assert fast.scaled(0.5).rate == pytest.approx(2 * w.rate)


def test_clipped_head_and_window():
    w = Workload((Request(0.0, 3000, 10), Request(1.0, 10, 5000), Request(2.0, 5, 5)))
    c = w.clipped(2048)
    assert [(r.prompt_len, r.output_len) for r in c] == [(2038, 10), (1, 2047), (5, 5)]
    assert len(w.head(2)) == 2
    win = w.window(0.5, 2.0)
    assert [r.arrival for r in win] == [0.0, 1.0]
    assert w.clipped(None) is w


def test_summary_reports_rate_cv_and_lengths():
    s = synthetic(poisson(5.0), length_model("alpaca"), 2000, seed=1).summary()
    assert s["requests"] == 2000
    assert s["rate"] == pytest.approx(5.0, rel=0.1)
    assert s["prompt_mean"] == pytest.approx(19.3, rel=0.1)


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ((Request(0.0, 0, 5),), "prompt_len >= 1 and output_len >= 1"),
        ((Request(0.0, 5, 0),), "prompt_len >= 1 and output_len >= 1"),
        ((Request(1.0, 5, 5), Request(0.5, 5, 5)), "request 1 arrives out of order"),
    ],
)
def test_bad_requests_are_refused(requests, message):
    with pytest.raises(ConfigError, match=message):
        Workload(requests)


def test_from_arrays_sorts_and_checks_lengths():
    w = Workload.from_arrays([2.0, 1.0], [3, 4], [5, 6])
    assert w[0] == (1.0, 4, 6)
    with pytest.raises(ConfigError, match="differ in length"):
        Workload.from_arrays([1.0], [1, 2], [1])
    with pytest.raises(ConfigError, match="num_requests must be >= 1"):
        synthetic(poisson(1.0), length_model("alpaca"), 0)
