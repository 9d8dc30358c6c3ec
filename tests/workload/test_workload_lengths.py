"""Length models: published means, Zipf skew, clipping to a context."""

from __future__ import annotations

import numpy as np
import pytest

from fsd.errors import ConfigError
from fsd.workload.length_models import PRESETS, Fixed, Lognormal, Zipf, clip_lengths, length_model


@pytest.mark.parametrize(
    ("name", "prompt_mean", "output_mean"),
    [("sharegpt", 161.31, 337.99), ("alpaca", 19.31, 58.45), ("azure-conv", 1155, 211)],
)
def test_presets_reproduce_the_published_means_before_clipping(name, prompt_mean, output_mean):
    model = PRESETS[name]
    rng = np.random.default_rng(0)
    assert model.prompt.sample(200_000, rng).mean() == pytest.approx(prompt_mean, rel=0.02)
    assert model.output.sample(200_000, rng).mean() == pytest.approx(output_mean, rel=0.02)


def test_azure_conv_preset_matches_the_trace_p99():
    rng = np.random.default_rng(1)
    model = PRESETS["azure-conv"]
    assert np.percentile(model.prompt.sample(200_000, rng), 99) == pytest.approx(4142, rel=0.05)
    assert np.percentile(model.output.sample(200_000, rng), 99) == pytest.approx(601, rel=0.05)


def test_zipf_is_bounded_and_skewed_by_theta():
    rng = np.random.default_rng(2)
    x = Zipf(1.0, 100).sample(200_000, rng)
    assert x.min() >= 1 and x.max() <= 100
    counts = np.bincount(x)
    assert counts[1] / counts[2] == pytest.approx(2.0, rel=0.05)  # P(k) ∝ 1/k
    flat = Zipf(0.0, 100).sample(200_000, rng)
    assert flat.mean() == pytest.approx(50.5, rel=0.02)  # theta 0 = uniform
    assert Zipf(1.5, 100).sample(10_000, rng).mean() < Zipf(0.5, 100).sample(10_000, rng).mean()


def test_sampling_is_deterministic_for_a_seed():
    model = length_model("sharegpt")
    a = model.sample(500, np.random.default_rng(5))
    b = model.sample(500, np.random.default_rng(5))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_clipping_keeps_the_output_and_trims_the_prompt():
    p, o = clip_lengths(np.array([1000, 10, 0, 5000]), np.array([100, 3000, 0, 50]), 2048)
    assert p.tolist() == [1000, 1, 1, 1998]
    assert o.tolist() == [100, 2047, 1, 50]
    assert np.all(p + o <= 2048)
    p, o = clip_lengths(np.array([10]), np.array([500]), None, max_output=64)
    assert (p.tolist(), o.tolist()) == ([10], [64])


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_respects_its_context(name):
    model = PRESETS[name]
    p, o = model.sample(20_000, np.random.default_rng(3))
    assert p.min() >= 1 and o.min() >= 1
    if model.max_context:
        assert (p + o).max() <= model.max_context


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: length_model("wikipedia"), "unknown length model 'wikipedia'.*sharegpt"),
        (lambda: length_model("alpaca", theta=1.0), "theta applies to the zipf"),
        (lambda: Lognormal(0.5, 1.0), "lognormal mean must be >= 1"),
        (lambda: Lognormal(10, -1.0), "sigma must be >= 0"),
        (lambda: Zipf(-1.0, 10), "theta must be >= 0"),
        (lambda: Zipf(1.0, 10, low=20), "1 <= low <= high"),
        (lambda: Fixed(0), "fixed length must be >= 1"),
        (lambda: PRESETS["alpaca"].with_context(1), "max_context must be >= 2"),
    ],
)
def test_bad_length_parameters_name_the_field(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_zipf_theta_override():
    model = length_model("zipf", theta=2.0)
    assert model.prompt.theta == 2.0 and model.output.theta == 2.0
