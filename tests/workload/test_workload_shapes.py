"""Validation length shapes (code-bursty, alike, summarize, decode-heavy) and mixtures of
two services: medians and tails for a fixed seed, mixture proportions, name errors."""

from __future__ import annotations

import numpy as np
import pytest

from fsd.errors import ConfigError
from fsd.workload import Mixture, length_model, mixture, poisson, synthetic
from fsd.workload.length_models import PRESETS, Lognormal, Uniform

N = 200_000


def draw(name: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return length_model(name).sample(N, np.random.default_rng(seed))


def test_code_bursty_is_prefill_dominated_with_tails():
    p, o = draw("code-bursty")
    assert np.median(p) == pytest.approx(1500, rel=0.03)
    assert np.median(o) == pytest.approx(13, abs=1)
    assert 0.02 < (p > 8000).mean() < 0.05  # a tail past 8k tokens
    assert p.max() == 16384 and o.max() == 1024  # the caps
    assert np.percentile(o, 99) == pytest.approx(340, rel=0.1)
    assert p.sum() > 20 * o.sum()


def test_alike_is_light_tailed():
    p, o = draw("alike")
    assert (p.min(), p.max()) == (240, 360) and (o.min(), o.max()) == (160, 240)
    assert p.mean() == pytest.approx(300, rel=0.01) and o.mean() == pytest.approx(200, rel=0.01)


def test_summarize_and_decode_heavy():
    p, o = draw("summarize")
    assert (p.min(), p.max()) == (2048, 6144) and (o.min(), o.max()) == (100, 300)
    p, o = draw("decode-heavy")
    assert np.median(p) == pytest.approx(100, rel=0.03)
    assert np.median(o) == pytest.approx(800, rel=0.03) and o.max() == 4096
    assert o.sum() > 5 * p.sum()


@pytest.mark.parametrize("name", ["code-bursty", "alike", "summarize", "decode-heavy"])
def test_shapes_give_whole_counts_of_at_least_one(name):
    p, o = draw(name, seed=7)
    assert p.dtype == o.dtype == np.int64
    assert p.min() >= 1 and o.min() >= 1


def test_from_median_and_uniform_and_their_errors():
    d = Lognormal.from_median(100, 0.5)
    assert np.median(d.sample(N, np.random.default_rng(1))) == pytest.approx(100, rel=0.02)
    with pytest.raises(ConfigError, match="median must be >= 1"):
        Lognormal.from_median(0.5, 1.0)
    with pytest.raises(ConfigError, match="cap \\(high\\) must be >= 1"):
        Lognormal(10, 1.0, high=0)
    with pytest.raises(ConfigError, match="1 <= low <= high"):
        Uniform(10, 5)


def test_mixture_by_name_draws_each_request_whole_from_one_service():
    model = length_model("mix:alike+summarize:0.3")
    assert isinstance(model, Mixture) and model.name == "mix:alike+summarize:0.3"
    p, o = model.sample(N, np.random.default_rng(3))
    from_alike = p <= 360  # the two services' prompts do not overlap
    assert from_alike.mean() == pytest.approx(0.3, abs=0.005)
    assert o[from_alike].max() <= 240 and o[~from_alike].min() >= 100  # pairs kept
    assert length_model("mix:alike+summarize").weight == 0.5


def test_mixture_function_is_the_name_and_is_seeded():
    a = mixture("sharegpt", "code-bursty", 0.25)
    b = length_model("mix:sharegpt+code-bursty:0.25")
    assert a.name == b.name
    x = a.sample(1000, np.random.default_rng(5))
    y = b.sample(1000, np.random.default_rng(5))
    assert all(np.array_equal(u, v) for u, v in zip(x, y, strict=True))
    nested = mixture(a, PRESETS["alike"], 0.5)  # models, not only names
    assert nested.name == "mix:mix:sharegpt+code-bursty:0.25+alike:0.5"
    assert "0.25 x" in a.describe()


def test_mixture_bounds_and_synthetic_workload():
    model = length_model("mix:code-bursty+alpaca:0.5").with_context(4096)
    p, o = model.sample(20_000, np.random.default_rng(2))
    assert (p + o).max() <= 4096 and p.min() >= 1 and o.min() >= 1
    w = synthetic(poisson(5.0), model, 200, seed=1)
    assert len(w) == 200 and w.params["lengths"] == model.name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("mix:sharegpt", r"'mix:sharegpt': a mixture is mix:A\+B:W"),
        ("mix:sharegpt+", "a mixture is mix:A"),
        ("mix:a+b+c:0.5", "a mixture is mix:A"),
        ("mix:sharegpt+books:0.5", r"unknown component 'books'; choose from: sharegpt"),
        ("mix:sharegpt+alpaca:half", r"weight 'half' is not a number in \[0, 1\]"),
        ("mix:sharegpt+alpaca:1.5", r"weight '1.5' is not a number in \[0, 1\]"),
        ("mix:sharegpt+alpaca:nan", "weight 'nan'"),
        ("mix:sharegpt+alpaca:", "weight ''"),
        ("books", r"unknown length model 'books'.*or mix:A\+B:W"),
    ],
)
def test_bad_mixture_names_say_what_is_wrong(name, message):
    with pytest.raises(ConfigError, match=message):
        length_model(name)


def test_mixture_weight_and_theta_errors():
    with pytest.raises(ConfigError, match=r"mixture weight must be in \[0, 1\]"):
        mixture("alike", "alpaca", -0.1)
    with pytest.raises(ConfigError, match="theta applies to the zipf"):
        length_model("mix:zipf+alpaca:0.5", theta=1.2)
    with pytest.raises(ConfigError, match="unknown length model 'books'"):
        mixture("books", "alpaca")


def test_a_scenario_phase_takes_a_mixture_and_bounds_it():
    from fsd.workload.scenario import parse_scenario
    from fsd.workload.timeline import expand

    text = (
        '[scenario]\nname = "mixed"\nseed = 2\nduration = 20.0\n\n[[phase]]\n'
        'arrival = "poisson"\nrate = 20.0\n'
        'lengths = { preset = "mix:summarize+alike:0.5", max_context = 3000 }\n'
    )
    scenario = parse_scenario(text, "mixed.toml", None)
    model = scenario.phases[0].lengths
    assert isinstance(model, Mixture) and model.max_context == 3000
    jobs = expand(scenario).arrivals
    assert jobs and max(j.prompt_len + j.output_len for j in jobs) <= 3000
    with pytest.raises(ConfigError, match=r"mixed\.toml: phase\[0\]\.lengths: .*unknown component"):
        parse_scenario(text.replace("summarize", "books"), "mixed.toml", None)
