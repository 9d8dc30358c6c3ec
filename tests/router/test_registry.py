"""The router registry's names and one-line errors, ClusterConfig's checks, and the
[cluster] table of fsd.toml."""

from __future__ import annotations

import pytest

from fsd.config import ClusterConfig
from fsd.config_file import build_configs
from fsd.errors import ConfigError
from fsd.router.registry import (
    DEFAULT_ROUTER,
    ROUTERS,
    check_router,
    make_router,
    resolve_router,
)
from tests.router.helpers import BS, COST


def test_every_router_is_built_by_name_and_default_is_fsd():
    assert set(ROUTERS) == {"fsd", "round-robin", "least-loaded", "power-of-two", "cache-aware"}
    assert resolve_router("default") == DEFAULT_ROUTER == "fsd"
    for name in (*ROUTERS, "default"):
        r = make_router(ClusterConfig(replicas=3, router=name), COST, BS)
        assert r.name == resolve_router(name) and len(r.views) == 3


def test_an_unknown_router_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError) as err:
        check_router("shortest")
    text = str(err.value)
    assert "\n" not in text and "'shortest'" in text
    for name in ("default", *ROUTERS):
        assert name in text


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("replicas", 0, "replicas must be in [1, 4096]"),
        ("replicas", 1.5, "replicas must be an integer"),
        ("router", None, "router must be a string"),
        ("push_interval", -1.0, "push_interval must be in [0,"),
        ("affinity_s", float("inf"), "affinity_s must be a finite number"),
        ("imbalance_s", -0.1, "imbalance_s must be in [0,"),
        ("imbalance_ratio", 0.9, "imbalance_ratio must be in [1,"),
    ],
)
def test_cluster_config_refuses_values_out_of_range(field, value, words):
    with pytest.raises(ConfigError, match=None) as err:
        ClusterConfig(**{field: value})
    assert words in str(err.value)


def test_the_cluster_table_and_overrides_build_a_cluster_config(tmp_path):
    toml = tmp_path / "fsd.toml"
    toml.write_text('[cluster]\nreplicas = 4\nrouter = "cache-aware"\naffinity_s = 0.0\n')
    _, _, cluster = build_configs(toml)
    assert cluster == ClusterConfig(replicas=4, router="cache-aware", affinity_s=0.0)
    _, _, cluster = build_configs(toml, replicas=2, router=None)  # None keeps the file's
    assert (cluster.replicas, cluster.router) == (2, "cache-aware")
    toml.write_text('[cluster]\nrouter = "nope"\n')
    with pytest.raises(ConfigError, match="unknown router 'nope'"):
        build_configs(toml)
    toml.write_text("[cluster]\nreplica = 2\n")
    with pytest.raises(ConfigError, match="unknown key 'replica' in \\[cluster\\]"):
        build_configs(toml)
