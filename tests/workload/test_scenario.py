"""Scenario files: the shipped ones load, bad ones are refused naming file, field and value,
and expansion is a deterministic function of the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fsd.errors import ConfigError
from fsd.workload.feed import TimelineFeed
from fsd.workload.scenario import AbortAll, BurstEvent, RetuneEvent, load_scenario, parse_scenario
from fsd.workload.timeline import Arrival, expand

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

BASE = """
[scenario]
name = "t"
seed = 3
duration = 20.0

[[phase]]
arrival = "poisson"
rate = 5.0
lengths = "alpaca"
"""


def parse(text: str, tmp_path: Path = Path(".")):
    return parse_scenario(text, "t.toml", tmp_path)


def test_every_shipped_scenario_loads_and_expands():
    names = sorted(p.name for p in SCENARIOS.glob("*.toml"))
    assert len(names) >= 9
    for path in sorted(SCENARIOS.glob("*.toml")):
        scenario = load_scenario(path)
        timeline = expand(scenario)
        assert timeline.arrivals, path.name
        times = [a.time for a in timeline.arrivals]
        assert times == sorted(times) and times[0] >= 0 and times[-1] < timeline.duration
        assert all(a.prompt_len >= 1 and a.output_len >= 1 for a in timeline.arrivals)


def test_expansion_is_deterministic_and_seeded():
    a, b = expand(parse(BASE)), expand(parse(BASE))
    assert a == b
    other = expand(parse(BASE.replace("seed = 3", "seed = 4")))
    assert [x.time for x in other.arrivals] != [x.time for x in a.arrivals]


def test_poisson_phase_has_about_the_asked_rate():
    timeline = expand(parse(BASE.replace("duration = 20.0", "duration = 400.0")))
    assert 1800 < len(timeline.arrivals) < 2200  # 5/s x 400 s; sd ~45


def test_a_ramp_puts_more_arrivals_where_the_rate_is_higher():
    text = BASE.replace("rate = 5.0", "rate = 1.0\nrate_end = 9.0").replace("20.0", "200.0")
    times = np.array([a.time for a in expand(parse(text)).arrivals])
    first, second = (times < 100).sum(), (times >= 100).sum()
    # expected 300 and 700 (integral of the linear rate over each half)
    assert 230 < first < 370 and 600 < second < 800


def test_phases_run_back_to_back_or_from_their_start():
    text = (
        BASE
        + """
[[phase]]
name = "later"
start = 10.0
arrival = "uniform"
rate = 2.0
lengths = { prompt = 7, output = 3 }
"""
    )
    s = parse(text)
    assert [(p.start, p.duration) for p in s.phases] == [(0.0, 20.0), (10.0, 10.0)]
    later = [a for a in expand(s).arrivals if a.origin == "later"]
    assert len(later) == 19 or len(later) == 20
    assert all(10.0 <= a.time < 20.0 and (a.prompt_len, a.output_len) == (7, 3) for a in later)


def test_events_become_bursts_and_actions():
    text = (
        BASE
        + """
[[event]]
at = 5.0
kind = "burst"
count = 4
prompt_len = 100
output_len = 9
spread = 2.0

[[event]]
at = 8.0
kind = "retune"
set = { policy = "fcfs", quanta = [0.01, 0.02] }

[[event]]
at = 9.0
kind = "abort-all"
"""
    )
    s = parse(text)
    assert [type(e) for e in s.events] == [BurstEvent, RetuneEvent, AbortAll]
    t = expand(s)
    burst = [a for a in t.arrivals if a.origin == "burst@5s"]
    assert [a.time for a in burst] == [5.0, 5.5, 6.0, 6.5]
    assert {(a.prompt_len, a.output_len) for a in burst} == {(100, 9)}
    assert [(a.time, a.kind) for a in t.actions] == [(8.0, "retune"), (9.0, "abort-all")]
    assert t.actions[0].changes == {"policy": "fcfs", "quanta": [0.01, 0.02]}


def test_time_and_length_scale_keep_the_same_jobs():
    s = parse(BASE)
    t1, t2 = expand(s), expand(s.scaled(time_scale=2.0, length_scale=0.5))
    assert len(t1.arrivals) == len(t2.arrivals) and t2.duration == 10.0
    assert [a.time / 2 for a in t1.arrivals] == pytest.approx([a.time for a in t2.arrivals])
    assert [max(1, round(a.output_len * 0.5)) for a in t1.arrivals] == [
        a.output_len for a in t2.arrivals
    ]


def test_rate_factor_and_duration_cut():
    s = parse(BASE.replace("20.0", "100.0"))
    base = len(expand(s).arrivals)
    doubled = len(expand(s.with_rate_factor(2.0)).arrivals)
    assert 1.7 * base < doubled < 2.3 * base
    cut = expand(s.with_duration(10.0))
    assert cut.duration == 10.0 and all(a.time < 10.0 for a in cut.arrivals)


def test_max_context_and_output_clip(tmp_path):
    text = BASE.replace("duration = 20.0", "duration = 20.0\nmax_context = 64\nmax_output = 8")
    text = text.replace('"alpaca"', '"sharegpt"')
    for a in expand(parse(text)).arrivals:
        assert a.output_len <= 8 and a.prompt_len + a.output_len <= 64


def test_trace_phase_takes_a_window_of_the_trace(tmp_path):
    (tmp_path / "tr.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"{t},{10 + t},{1 + t}\n" for t in range(0, 30, 2))
    )
    text = """
[scenario]
duration = 10.0
[[phase]]
arrival = "trace"
trace = "tr.csv"
trace_offset = 4.0
time_scale = 2.0
"""
    t = expand(parse_scenario(text, "x.toml", tmp_path))
    # rate x2: trace second s arrives at s / 2; the window starts at 4 / 2 = 2 s
    assert [(a.time, a.prompt_len) for a in t.arrivals] == [
        (0.0, 14),
        (1.0, 16),
        (2.0, 18),
        (3.0, 20),
        (4.0, 22),
        (5.0, 24),
        (6.0, 26),
        (7.0, 28),
        (8.0, 30),
        (9.0, 32),
    ]


def test_inline_text_and_missing_files(tmp_path):
    assert load_scenario(BASE).source == "<inline>"
    with pytest.raises(ConfigError, match=r"scenario file '.*nope.toml' does not exist"):
        load_scenario(tmp_path / "nope.toml")
    path = tmp_path / "steady.toml"
    path.write_text(BASE)
    assert load_scenario(path).name == "t"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("rate = 5.0", "rate = -1"), r"t.toml: phase\[0\].rate: must be > 0, got -1"),
        (("rate = 5.0", 'rate = "fast"'), r"phase\[0\].rate: must be a number, got 'fast'"),
        (("rate = 5.0", "rate = 5.0\nburst = 3"), r"phase\[0\].burst: unknown field"),
        (('"poisson"', '"weibull"'), r"phase\[0\].arrival: must be one of .*got 'weibull'"),
        (("rate = 5.0", "rate = 5.0\ncv = 3"), r"phase\[0\].cv: a poisson process has cv 1"),
        (('"alpaca"', '"shakespeare"'), r"phase\[0\].lengths: unknown length model 'shakespeare'"),
        (("duration = 20.0", "duration = 0"), r"t.toml: scenario.duration: must be > 0, got 0"),
        (("duration = 20.0", ""), r"t.toml: scenario.duration: is required"),
        (("seed = 3", "seed = 1.5"), r"seed: must be a whole number, got 1.5"),
        (("[scenario]", "[scenari]"), r"t.toml: scenari: unknown field"),
        (
            ("rate = 5.0", "rate = 5.0\nduration = 30"),
            r"phase\[0\].duration: the phase ends at 30 s",
        ),
        (("[[phase]]", "[phase]"), r"phase: must be an array of tables"),
        (("rate = 5.0", "rate = [5"), r"t.toml: not valid TOML"),
    ],
)
def test_bad_fields_are_named_with_their_value(change, message):
    old, new = change
    assert old in BASE
    with pytest.raises(ConfigError, match=message):
        parse(BASE.replace(old, new, 1))


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ('at = 20.0\nkind = "abort-all"', r"event\[0\].at: 20 s is not before the scenario's end"),
        ('at = 1.0\nkind = "explode"', r"event\[0\].kind: must be one of burst, retune, abort-all"),
        ('at = 1.0\nkind = "retune"', r"event\[0\].set: is required"),
        ('at = 1.0\nkind = "burst"\ncount = 0', r"event\[0\].count: must be >= 1, got 0"),
        (
            'at = 1.0\nkind = "burst"\ncount = 2\nprompt_len = 4',
            r"event\[0\].output_len: is required",
        ),
        ('at = -1\nkind = "abort-all"', r"event\[0\].at: must be >= 0, got -1"),
    ],
)
def test_bad_events_are_named(event, message):
    with pytest.raises(ConfigError, match=message):
        parse(BASE + "\n[[event]]\n" + event + "\n")


def test_lengths_tables_and_their_errors():
    custom = BASE.replace(
        '"alpaca"', '{ prompt = { dist = "zipf", theta = 1.2, high = 50 }, output = 5 }'
    )
    arrivals = expand(parse(custom)).arrivals
    assert all(1 <= a.prompt_len <= 50 and a.output_len == 5 for a in arrivals)
    bad = BASE.replace('"alpaca"', '{ prompt = { dist = "lognormal", mean = 0 }, output = 5 }')
    with pytest.raises(ConfigError, match=r"phase\[0\].lengths.prompt.mean: must be|mean must be"):
        parse(bad)


def test_missing_trace_names_the_field(tmp_path):
    text = '[scenario]\nduration = 5\n[[phase]]\narrival = "trace"\ntrace = "gone.csv"\n'
    with pytest.raises(ConfigError, match=r"x.toml: phase\[0\].trace: trace file 'gone.csv'"):
        parse_scenario(text, "x.toml", tmp_path)


def test_feed_hands_out_due_steps_in_order_with_stable_ids():
    text = BASE + '\n[[event]]\nat = 1.0\nkind = "abort-all"\n'
    timeline = expand(parse(text))
    feed = TimelineFeed(timeline, start=100.0, prefix="x-")
    ids = feed.job_ids
    assert feed.next_time() == 100.0 + timeline.steps()[0][0]
    first = feed.due(101.0)
    assert [when for when, _, _ in first] == sorted(when for when, _, _ in first)
    assert all(when <= 101.0 for when, _, _ in first)
    kinds = [type(step).__name__ for _, _, step in first]
    assert kinds.count("Action") == 1
    rest = feed.due(1e9)
    assert feed.done and feed.next_time() is None
    got = [job_id for _, job_id, step in first + rest if isinstance(step, Arrival)]
    assert got == ids == feed.started_ids()
