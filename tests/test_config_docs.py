"""fsd.example.toml documents every configuration key, and it loads as written."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from fsd import config
from fsd.config import (
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedConfig,
    ServerConfig,
)
from fsd.config_file import build_configs
from fsd.sched.rules import FsdRules

EXAMPLE = Path(__file__).resolve().parent.parent / "fsd.example.toml"
SECTIONS = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "sched": SchedConfig,
    "parallel": ParallelConfig,
    "server": ServerConfig,
    "cluster": config.ClusterConfig,
    "sched.fsd": FsdRules,  # the default policy's own rules (commented: its defaults)
}


def documented() -> dict[str, set[str]]:
    keys: dict[str, set[str]] = {}
    section = None
    for line in EXAMPLE.read_text().splitlines():
        if m := re.match(r"#?\s*\[([\w.-]+)\]", line):  # [sched.fsd]: a policy's table
            section = m.group(1)
            keys[section] = set()
        elif section and (m := re.match(r"#?\s*(\w+)\s*=", line)):
            keys[section].add(m.group(1))
    return keys


def test_every_config_field_is_in_the_example():
    keys = documented()
    for section, cls in SECTIONS.items():
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields == keys.get(section), section


def test_the_example_loads_and_equals_the_defaults():
    engine, server, cluster = build_configs(EXAMPLE)
    assert engine.sched == SchedConfig() and engine.cache == CacheConfig()
    assert engine.model == ModelConfig() and server == ServerConfig()
    assert cluster == config.ClusterConfig()


def test_the_examples_fsd_table_shows_fsds_defaults_and_loads(tmp_path):
    text = EXAMPLE.read_text().split("# [sched.fsd]\n", 1)[1].split("\n\n", 1)[0]
    table = "[sched]\n[sched.fsd]\n" + "\n".join(ln.removeprefix("# ") for ln in text.splitlines())
    toml = tmp_path / "fsd.toml"
    toml.write_text(table)
    engine, _, _ = build_configs(toml)
    shown = dict(engine.sched.policy_settings)
    assert shown == {f"fsd.{f.name}": f.default for f in dataclasses.fields(FsdRules)}
