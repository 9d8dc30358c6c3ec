"""Building the config slices from fsd.toml and CLI overrides (`build_configs`)."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from fsd.config import SLICE_TYPES, ClusterConfig, EngineConfig, ServerConfig
from fsd.config_checks import setting_pairs
from fsd.errors import ConfigError, read_parsed


def load_toml(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read fsd.toml: tables [model], [cache], [sched] (with a [sched.POLICY] table of
    each policy's own settings), [parallel], [server], [cluster]."""
    p = Path(path).expanduser()
    data = read_parsed(p, "config file", "TOML", tomllib.loads, tomllib.TOMLDecodeError)
    tables = {**SLICE_TYPES, "server": ServerConfig, "cluster": ClusterConfig}
    for section, values in data.items():
        if section not in tables:
            raise ConfigError(f"{p}: unknown section [{section}]; known: {', '.join(tables)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{p}: [{section}] must be a table")
        known = {f.name for f in dataclasses.fields(tables[section])}
        for key, value in values.items():
            if section == "sched" and isinstance(value, dict):
                continue  # [sched.POLICY]: that policy's own settings, checked by the registry
            if key not in known:
                raise ConfigError(
                    f"{p}: unknown key {key!r} in [{section}]; known: {', '.join(sorted(known))}"
                )
    return data


def build_configs(
    path: str | Path | None = None, **overrides: Any
) -> tuple[EngineConfig, ServerConfig, ClusterConfig]:
    """Engine, server and cluster configs from an optional TOML file, then overrides.

    Overrides use the field names (e.g. policy="fcfs", endpoint="tcp://...",
    replicas=2); None values are ignored so unset CLI flags keep the file's value. The
    policy and router names are checked here too, by their registries: a bad one fails
    at start, not in the daemon.
    """
    from fsd.router.registry import check_router
    from fsd.sched.registry import check_policies

    data = load_toml(path) if path else {}
    flat: dict[str, Any] = {}
    for section in SLICE_TYPES:
        for key, value in data.get(section, {}).items():
            if isinstance(value, dict):  # [sched.POLICY] -> POLICY.FIELD
                flat.update({f"{key}.{name}": v for name, v in value.items()})
            else:
                flat[key] = value
    server_kw = dict(data.get("server", {}))
    cluster_kw = dict(data.get("cluster", {}))
    server_fields = {f.name for f in dataclasses.fields(ServerConfig)}
    cluster_fields = {f.name for f in dataclasses.fields(ClusterConfig)}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in server_fields:
            server_kw[key] = value
        elif key in cluster_fields:
            cluster_kw[key] = value
        elif key == "policy_settings":  # a command line's, over the file's
            flat.update(setting_pairs(value))
        else:
            flat[key] = value
    if "quanta" in flat and isinstance(flat["quanta"], list):
        flat["quanta"] = tuple(flat["quanta"])
    try:
        server = ServerConfig(**server_kw)
        cluster = ClusterConfig(**cluster_kw)
    except TypeError as exc:
        raise ConfigError(f"[server] or [cluster]: {exc}") from None
    engine = EngineConfig.from_kwargs(**flat)
    check_policies(engine.sched, engine.cache)
    check_router(cluster.router)
    return engine, server, cluster
