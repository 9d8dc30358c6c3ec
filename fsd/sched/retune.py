"""Which settings change live, and whether a change is valid: the one retune rule.

`Engine.retune` applies what this returns; the scenario injector calls it to check a
scripted retune before the scenario starts, so both refuse with the same words.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from fsd.config import (
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedConfig,
    ServerConfig,
    check_prefill_chunk,
)
from fsd.config_checks import setting_pairs
from fsd.errors import ConfigError, SettingError
from fsd.sched.registry import check_policies, setting_names

# CacheConfig fields a running engine can change (the KV policy, its reserve, the prefix cache)
RETUNABLE_CACHE = (
    "kv_policy", "reserve_min_jobs", "reserve_top_levels", "admit_fraction", "prefix_cache",
)  # fmt: skip
# SchedConfig fields: all but the profile (service is charged in one cost model)
RETUNABLE_SCHED = tuple(f.name for f in dataclasses.fields(SchedConfig) if f.name != "profile")
# each policy's own settings, POLICY.FIELD (fsd.sched.settings): retunable, each alone
POLICY_SETTINGS = setting_names()
RETUNABLE = tuple(sorted(RETUNABLE_SCHED + RETUNABLE_CACHE)) + POLICY_SETTINGS
# every setting fsd.toml has: one of these that is not retunable is known, but fixed at start
KNOWN = frozenset(
    f.name
    for cls in (ModelConfig, CacheConfig, SchedConfig, ParallelConfig, ServerConfig)
    for f in dataclasses.fields(cls)
) | set(POLICY_SETTINGS)


def plan_retune(
    sched: SchedConfig, cache: CacheConfig, changes: Mapping[str, Any]
) -> tuple[SchedConfig | None, CacheConfig | None]:
    """The new configs (None: that slice is unchanged); SettingError if any change is refused.

    Nothing is applied here: a refused retune changes nothing.
    """
    check_names(changes)
    plain = {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}
    sched_kw = {k: v for k, v in plain.items() if k in RETUNABLE_SCHED}
    own = {k: v for k, v in plain.items() if k in POLICY_SETTINGS}
    if own:  # one policy setting changes; the others keep theirs
        given = sched_kw.get("policy_settings", sched.policy_settings)
        sched_kw["policy_settings"] = {**dict(setting_pairs(given)), **own}
    cache_kw = {k: v for k, v in plain.items() if k in RETUNABLE_CACHE}
    try:
        new_sched = dataclasses.replace(sched, **sched_kw)  # each field validates itself
        new_cache = dataclasses.replace(cache, **cache_kw)
        check_policies(new_sched, new_cache)
        check_prefill_chunk(new_sched.prefill_chunk, new_cache.block_size)
    except (ConfigError, TypeError) as exc:
        raise SettingError(str(exc)) from None
    return (new_sched if sched_kw else None), (new_cache if cache_kw else None)


def check_names(changes: Mapping[str, Any]) -> None:
    """SettingError unless every name is retunable: an unknown name is called unknown
    (with the nearest retunable one, for a typo), a setting fixed at start is called so."""
    unknown = sorted(k for k in changes if k not in KNOWN)
    fixed = sorted(k for k in changes if k in KNOWN and k not in RETUNABLE)
    valid = f"retunable: {', '.join(RETUNABLE)}"
    if unknown:
        near = [m for k in unknown for m in difflib.get_close_matches(k, RETUNABLE, 1)]
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        s = "s" if len(unknown) > 1 else ""
        raise SettingError(f"unknown setting{s} {', '.join(unknown)}{hint}; {valid}")
    if fixed:
        raise SettingError(
            f"cannot retune {', '.join(fixed)} while running: fixed when the daemon starts "
            f"(set in fsd.toml, then restart); {valid}"
        )


def plain_value(value: Any) -> Any:
    """A retune value as telemetry can carry it (tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value
