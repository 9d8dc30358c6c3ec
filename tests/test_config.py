import pytest

from fsd.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedConfig,
    ServerConfig,
)
from fsd.errors import ConfigError
from fsd.jobs import SamplingParams


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
        (lambda: SchedConfig(charge_prefill="yes"), "charge_prefill must be true or false"),
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


def test_numbers_are_accepted_where_a_float_is_wanted():
    assert SchedConfig(q1=1, quanta=[1, 2.5]).quanta == (1.0, 2.5)


def test_sampling_params_accept_lists_and_stay_hashable():
    p = SamplingParams(stop=["a", "b"], stop_token_ids=[1])
    assert p.stop == ("a", "b") and p.stop_token_ids == (1,)
    hash(p)
