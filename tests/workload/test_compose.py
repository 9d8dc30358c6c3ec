"""Composed workloads: merged tenants, phased rates, reasoning lengths."""

from __future__ import annotations

import numpy as np
import pytest

from fsd.errors import ConfigError
from fsd.workload import length_model, poisson, synthetic
from fsd.workload.compose import REASONING, merge, phased, tenants
from fsd.workload.spec import Workload


def test_tenants_keep_each_streams_share_and_merge_in_arrival_order():
    mix = [(length_model("alpaca"), 3.0, 1.0), (length_model("summarize"), 1.0, 4.0)]
    w = tenants(mix, rate=8.0, num_requests=800, seed=3)
    arrivals = [r.arrival for r in w.requests]
    assert arrivals == sorted(arrivals) and len(w.requests) == 800
    long = sum(r.prompt_len >= 2048 for r in w.requests)  # summarize prompts: 2048-6144
    assert long == 200  # its quarter of the requests, exactly
    assert tenants(mix, 8.0, 800, 3) == w  # seeded
    assert tenants(mix, 8.0, 800, 4) != w


def test_phased_arrivals_follow_each_phases_rate():
    w = phased([(100.0, 2.0), (50.0, 20.0), (100.0, 2.0)], length_model("alpaca"), seed=1)
    t = np.array([r.arrival for r in w.requests])
    counts = [((t >= a) & (t < b)).sum() for a, b in ((0, 100), (100, 150), (150, 250))]
    assert 150 < counts[0] < 250 and 850 < counts[1] < 1150 and 150 < counts[2] < 250
    assert t.max() < 250


def test_reasoning_outputs_are_bimodal_with_a_long_tail():
    w = synthetic(poisson(1.0), REASONING, 4000, 0)
    out = np.array([r.output_len for r in w.requests])
    assert np.percentile(out, 25) < 300 and np.percentile(out, 75) > 1500
    assert out.max() > 10_000


def test_bad_compositions_are_refused_clearly():
    with pytest.raises(ConfigError, match="positive shares"):
        tenants([(length_model("alpaca"), 0.0, 1.0)], 1.0, 10, 0)
    with pytest.raises(ConfigError, match="positive durations"):
        phased([(0.0, 1.0)], length_model("alpaca"), 0)
    with pytest.raises(ConfigError, match="at least one"):
        merge([], "none")
    hashed = Workload.from_arrays([0.0], [16], [4], prefix_hashes=[(1,)])
    with pytest.raises(ConfigError, match="prefix hashes"):
        merge([hashed], "x")
