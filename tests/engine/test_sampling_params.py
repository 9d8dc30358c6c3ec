"""SamplingParams validates every field once; whatever it accepts samples without error."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsd import LLM
from fsd import protocol as P
from fsd.cost import CostModel
from fsd.engine.output import JobFault
from fsd.engine.sampler import Sampler
from fsd.errors import ConfigError
from fsd.jobs import GREEDY_BELOW, MAX_TEMPERATURE, SamplingParams
from fsd.server.http.openai_errors import APIError
from fsd.server.http.openai_schema import parse_completion

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": NAN}, "temperature"),
        ({"temperature": INF}, "temperature"),
        ({"temperature": INF, "min_tokens": 3}, "temperature"),
        ({"temperature": -INF}, "temperature"),
        ({"temperature": -1e-300}, "temperature"),
        ({"temperature": 1e6}, "temperature"),
        ({"temperature": 2.0000001}, "temperature"),
        ({"temperature": 10**400}, "temperature"),
        ({"temperature": "1.0"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": NAN}, "top_p"),
        ({"top_p": INF}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.0000001}, "top_p"),
        ({"top_p": None}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2**31}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"max_tokens": 10**5000}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 16.0}, "max_tokens"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": 10**30}, "seed"),
        ({"seed": False}, "seed"),
        ({"seed": 1.0}, "seed"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 17}, "min_tokens"),
        ({"min_tokens": True}, "min_tokens"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"stop": ["x" * 1025]}, "stop"),
        ({"stop": [b"x"]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": ["x"]}, "stop_token_ids"),
        ({"stop_token_ids": [True]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": [2**31]}, "stop_token_ids"),
        ({"stop_token_ids": list(range(257))}, "stop_token_ids"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_invalid_sampling_fields_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        SamplingParams(**kwargs)
    message = str(err.value)
    assert message.split(" ", 1)[0] == field  # the HTTP layer reads the field from here
    assert len(message) < 300  # a huge value is never echoed whole


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0},
        {"temperature": MAX_TEMPERATURE},
        {"top_p": 1e-300},
        {"top_k": -1},
        {"top_k": 2**31 - 1},
        {"max_tokens": 2**31 - 1, "min_tokens": 2**31 - 1},
        {"seed": 0},
        {"seed": 2**64 - 1},
        {"stop": ["s"] * 16},
        {"stop": "x" * 1024},
        {"stop_token_ids": list(range(256))},
        {"stop_token_ids": 2**31 - 1},
    ],
)
def test_the_bounds_themselves_are_accepted(kwargs):
    SamplingParams(**kwargs)


@pytest.mark.parametrize(("value", "ok"), [(0.0, True), (MAX_TEMPERATURE, True), (2.5, False)])
def test_one_temperature_range_on_every_path(value, ok):
    """The SDK, the ZeroMQ wire and the HTTP API take the same range: OpenAI's [0, 2]."""
    assert MAX_TEMPERATURE == 2.0
    paths = (
        lambda: SamplingParams(temperature=value),
        lambda: P.Sampling(temperature=value).params(),
        lambda: parse_completion({"prompt": "x", "temperature": value}, "tiny").params,
    )
    each_path_takes(paths, ok, "temperature", value, r"temperature must be .*\[0, 2\]")


def each_path_takes(paths, ok: bool, name: str, value, refusal: str) -> None:
    """Each way of making sampling params takes `value` for `name`, or refuses it."""
    for make in paths:
        if ok:
            assert getattr(make(), name) == value
        else:
            with pytest.raises((ConfigError, APIError), match=refusal):
                make()


@pytest.mark.parametrize(
    ("seed", "ok"), [(0, True), (2**63, True), (2**64 - 1, True), (-1, False), (2**64, False)]
)
def test_one_seed_range_on_every_path(seed, ok):
    """The SDK, the ZeroMQ wire (msgpack: unsigned up to 2**64-1) and the HTTP API take
    the same seeds: [0, 2**64-1] (HTTP took [-2**63, 2**63-1] before)."""

    def wire() -> SamplingParams:
        sub = P.Submit(req_id="r", prompt_token_ids=[1], sampling=P.Sampling(seed=seed))
        decoded = P.decode_request(P.encode(sub))
        assert isinstance(decoded, P.Submit)
        return decoded.sampling.params()

    paths = [
        lambda: SamplingParams(seed=seed),
        lambda: parse_completion({"prompt": "x", "seed": seed}, "tiny").params,
    ]
    if seed < 2**64:  # msgpack cannot even encode 2**64: the client refuses it first
        paths.append(wire)
    each_path_takes(paths, ok, "seed", seed, r"seed must be .*\[0, 1844\d+\]")


def test_numbers_are_normalised_to_python_types():
    p = SamplingParams(temperature=1, top_p=1, stop="a", stop_token_ids=[3])
    assert type(p.temperature) is float and type(p.top_p) is float
    assert p.stop == ("a",) and p.stop_token_ids == (3,)


@pytest.mark.parametrize("temperature", [1e-46, 1e-300, 1e-6, 5e-324, 0.0])
def test_temperatures_below_the_floor_are_greedy(temperature):
    assert SamplingParams(temperature=temperature).greedy
    assert not SamplingParams(temperature=GREEDY_BELOW).greedy


def test_every_accepted_seed_seeds_a_generator():
    s = Sampler(0, torch.device("cpu"))
    x = torch.zeros(3, 8)
    params = [SamplingParams(temperature=1.0, seed=seed) for seed in (0, 2**63, 2**64 - 1)]
    rows = s.sample(x, params, ["a", "b", "c"])
    assert all(isinstance(t, int) and 0 <= t < 8 for t in rows)


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    path = tmp_path_factory.mktemp("profile") / "fixed.json"
    CostModel(name="fixed-test").save(path)
    return LLM("tiny", num_gpu_blocks=64, max_batch_size=8, profile=str(path))


def test_tiny_temperatures_generate_the_greedy_tokens(llm):
    prompts = [[5, 6, 7], [9] * 12]
    greedy = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=8))]
    for t in (1e-46, 1e-300, 1e-6):
        params = SamplingParams(max_tokens=8, temperature=t, min_tokens=2)
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == greedy
        assert all(o.finish_reason in ("length", "stop") for o in outs)


def test_stop_token_ids_outside_the_vocabulary_are_refused(llm):
    eng = llm.engine
    vocab = eng.loaded.arch.vocab_size
    with pytest.raises(ConfigError, match=r"^stop_token_ids .*vocabulary"):
        eng.add_request([1, 2], SamplingParams(stop_token_ids=[vocab], min_tokens=2))
    assert not eng.has_unfinished()
    with pytest.raises(ConfigError, match="^params"):
        eng.add_request([1, 2], {"temperature": 1.0})  # type: ignore[arg-type]
    out = llm.generate([1, 2], SamplingParams(max_tokens=3, stop_token_ids=[vocab - 1]))[0]
    assert out.finish_reason in ("length", "stop")


# ---- property: every accepted SamplingParams samples --------------------------------

VOCAB = 12

wide_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 5e-324, 1e-300, 1e-46, 1e-6, GREEDY_BELOW, 1e-5 * 1.01, 1.0, 2.0, 100.0]),
    st.integers(-(2**70), 2**70),
)
wide_ints = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 0, 1, 2, VOCAB - 1, VOCAB, VOCAB + 1, 2**31 - 1, 2**63, 2**64 - 1]),
    st.booleans(),
)


@st.composite
def sampling_params(draw) -> SamplingParams | None:
    kw = {
        "max_tokens": draw(st.one_of(st.integers(1, 64), wide_ints)),
        "temperature": draw(wide_floats),
        "top_k": draw(wide_ints),
        "top_p": draw(wide_floats),
        "seed": draw(st.one_of(st.none(), wide_ints)),
        "min_tokens": draw(st.one_of(st.integers(0, 4), wide_ints)),
        "stop_token_ids": draw(st.lists(st.integers(0, VOCAB - 1), max_size=4)),
    }
    try:
        return SamplingParams(**kw)
    except ConfigError:
        return None  # the validator refused it: only accepted ones must sample


logit_values = st.one_of(
    st.floats(-1e4, 1e4, width=32),
    st.sampled_from([NAN, INF, -INF, 3.0e38, -3.0e38, 0.0]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.tuples(
            sampling_params(),
            st.lists(logit_values, min_size=VOCAB, max_size=VOCAB),
            st.lists(st.integers(0, VOCAB - 1), max_size=VOCAB),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_every_accepted_sampling_params_samples_without_error(rows):
    rows = [r for r in rows if r[0] is not None]
    if not rows:
        return
    params = [r[0] for r in rows]
    logits = torch.tensor([r[1] for r in rows], dtype=torch.float32)
    banned = [tuple(r[2]) for r in rows]
    s = Sampler(0, torch.device("cpu"))
    out = s.sample(logits, params, [f"j{i}" for i in range(len(rows))], banned=banned)
    assert len(out) == len(rows)
    for token, (_, values, ban) in zip(out, rows, strict=True):
        assert not isinstance(token, JobFault), token
        assert type(token) is int and 0 <= token < VOCAB
        if any(not math.isnan(v) and v != -INF for i, v in enumerate(values) if i not in ban):
            assert token not in ban  # a token that may be produced wins over a banned one
