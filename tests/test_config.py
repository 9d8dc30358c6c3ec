import pytest

from fsd.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedConfig,
    ServerConfig,
)
from fsd.config_checks import setting_pairs
from fsd.errors import ConfigError
from fsd.jobs import SamplingParams
from fsd.sched.registry import check_policies
from fsd.sched.rules import FsdRules
from fsd.sched.settings import own_settings


def test_from_kwargs_routes_each_option_to_its_slice():
    cfg = EngineConfig.from_kwargs(
        model="tiny", num_gpu_blocks=64, block_size=8, max_batch_size=4, dtype="float32", seed=3
    )
    assert cfg.model == ModelConfig(model="tiny", dtype="float32", seed=3)
    assert cfg.cache.num_gpu_blocks == 64 and cfg.cache.block_size == 8
    assert cfg.sched.max_batch_size == 4


def test_unknown_option_names_it_and_lists_valid_ones():
    with pytest.raises(ConfigError, match="unknown engine option 'num_blocks'.*num_gpu_blocks"):
        EngineConfig.from_kwargs(num_blocks=3)


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: CacheConfig(block_size=12), "block_size"),
        (lambda: CacheConfig(num_gpu_blocks=0), "num_gpu_blocks"),
        (lambda: CacheConfig(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
        (lambda: SchedConfig(max_batch_size=0), "max_batch_size"),
        (lambda: ModelConfig(dtype="float8"), "dtype"),
        (lambda: ModelConfig(device="tpu"), "device"),
        (lambda: SamplingParams(max_tokens=0), "max_tokens"),
        (lambda: SamplingParams(temperature=-1), "temperature"),
        (lambda: SamplingParams(top_p=0), "top_p"),
        (lambda: SamplingParams(stop=[""]), "stop"),
        (lambda: SamplingParams(stop_token_ids=["x"]), "stop_token_ids"),
    ],
)
def test_invalid_settings_name_the_field(factory, match):
    with pytest.raises(ConfigError, match=match):
        factory()


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: SchedConfig(q1="5ms"), "q1 must be a number or none, got '5ms'"),
        (lambda: SchedConfig(max_batch_size=32.0), "max_batch_size must be an integer, got 32.0"),
        (lambda: SchedConfig(quanta=[0.01, "x"]), "quanta must be a list of numbers or none"),
        (lambda: CacheConfig(num_gpu_blocks=True), "num_gpu_blocks must be an integer or none"),
        (lambda: ModelConfig(seed="1"), "seed must be an integer, got '1'"),
        (lambda: ParallelConfig(tp="2"), "tp must be an integer, got '2'"),
        (lambda: ServerConfig(telemetry_hz="fast"), "telemetry_hz must be a number"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_field_and_the_type(factory, message):
    with pytest.raises(ConfigError) as err:
        factory()
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("fsd.charge_prefill", 2, "fsd setting charge_prefill must be true or false, got 2"),
        ("fsd.charge_prefill", "maybe", "fsd.charge_prefill must be bool, got 'maybe'"),
        ("fsd.threshold", 1.5, "fsd setting threshold must be an integer, got 1.5"),
        ("sj-mlfq.alpha", "soon", "sj-mlfq.alpha must be float, got 'soon'"),
    ],
)
def test_a_policy_setting_of_the_wrong_type_names_the_setting_and_the_type(setting, value, message):
    with pytest.raises(ConfigError) as err:
        check_policies(SchedConfig(policy_settings={setting: value}), CacheConfig())
    assert str(err.value).startswith(message)


def test_a_policy_settings_text_is_read_as_its_type():
    pairs = {"fsd.charge_prefill": "on", "fsd.threshold": "2", "fsd.alpha": "50"}
    own = own_settings(setting_pairs(pairs), "fsd", FsdRules)
    assert (own.charge_prefill, own.threshold, own.alpha) == (True, 2, 50.0)


def test_numbers_are_accepted_where_a_float_is_wanted():
    assert SchedConfig(q1=1, quanta=[1, 2.5]).quanta == (1.0, 2.5)


def test_sampling_params_accept_lists_and_stay_hashable():
    p = SamplingParams(stop=["a", "b"], stop_token_ids=[1])
    assert p.stop == ("a", "b") and p.stop_token_ids == (1,)
    hash(p)


# every setting a retune can change, with 2**62 (accepted before: a preemption threshold
# of 2**62 went through) and the bound its message names
RETUNE_BOUNDS = [
    (SchedConfig, "max_batch_size", 2**62, r"max_batch_size must be in \[1, 65536\]"),
    (SchedConfig, "max_batch_tokens", 2**62, r"max_batch_tokens must be in \[1, 16777216\]"),
    (SchedConfig, "num_levels", 2**62, "num_levels must be in 1..256"),
    (CacheConfig, "reserve_min_jobs", 2**62, r"reserve_min_jobs \(K\) must be in \[0, 65536\]"),
    (CacheConfig, "reserve_top_levels", 2**62, r"reserve_top_levels \(K'\) must be in \[0, 256\]"),
    (SchedConfig, "q1", 2**62, r"q1 must be <= 86400 seconds \(one day\)"),
    (SchedConfig, "q1", 10**400, "q1 must be a finite number"),
    (SchedConfig, "quanta", (0.01, 2**62), r"quanta must be <= 86400 seconds \(one day\) each"),
    (SchedConfig, "quanta", tuple(range(1, 258)), "quanta must list at most 256 quanta"),
    (SchedConfig, "quantum_ratio", 2**62, "quantum_ratio must be <= 1000, got 4.61169e"),
    (CacheConfig, "admit_fraction", 2**62, r"admit_fraction must be in \(0, 1\]"),
]


@pytest.mark.parametrize(("cls", "name", "value", "message"), RETUNE_BOUNDS)
def test_every_retunable_value_has_an_upper_bound_that_its_error_names(cls, name, value, message):
    with pytest.raises(ConfigError, match=message):
        cls(**{name: value})


# each policy's own retunable numbers, likewise (a policy setting is retunable alone)
POLICY_BOUNDS = [
    ("fsd.threshold", 2**62, r"fsd setting threshold must be in \[0, 256\] levels"),
    ("sj-mlfq.threshold", -1, r"sj-mlfq setting threshold must be in \[0, 256\] levels, got -1"),
    ("fsd.alpha", 2**62, r"fsd setting alpha must be in \(0, 1e\+06\] SLOs"),
    ("fsd.alpha", float("nan"), r"fsd setting alpha must be in \(0, 1e\+06\] SLOs, got nan"),
    ("mlfq.alpha", 0, r"mlfq setting alpha must be in \(0, 1e\+06\] SLOs, got 0"),
    ("fsd.waiting_alpha", 1e9, r"fsd setting waiting_alpha must be in \(0, 1e\+06\] SLOs"),
    ("fsd.promote", "up2", "fsd setting promote must be one of up1, top, entry"),
    ("fsd.demote", "never", "fsd setting demote must be one of always, gittins"),
]


@pytest.mark.parametrize(("setting", "value", "message"), POLICY_BOUNDS)
def test_every_policy_setting_has_bounds_that_its_error_names(setting, value, message):
    with pytest.raises(ConfigError, match=message):
        check_policies(SchedConfig(policy_settings={setting: value}), CacheConfig())


def test_a_single_level_ratio_is_bounded_too_and_the_bounds_themselves_are_accepted():
    with pytest.raises(ConfigError, match="quantum_ratio must be <= 1000, got 2000"):
        SchedConfig(quantum_ratio=2000.0, num_levels=1)
    top = SchedConfig(
        max_batch_size=65536, max_batch_tokens=1 << 24, num_levels=256, q1=86400.0,
        quantum_ratio=1.0001,
        policy_settings={"fsd.threshold": 256, "fsd.alpha": 1e6, "fsd.waiting_alpha": 1e6},
    )  # fmt: skip
    check_policies(top, CacheConfig())
    own = own_settings(top.policy_settings, "fsd", FsdRules)
    assert (own.threshold, own.alpha, own.waiting_alpha) == (256, 1e6, 1e6)
    assert CacheConfig(reserve_min_jobs=65536, reserve_top_levels=256).reserve_top_levels == 256
