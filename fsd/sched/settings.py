"""Each policy's own settings, declared once: a frozen dataclass `Settings` on its queue
class (fields made with `fsd.config_checks.doc`: default and help line).

Everywhere else a setting is named `POLICY.FIELD` (`gittins.guard`): in
`SchedConfig.policy_settings`, in fsd.toml (a `[sched.POLICY]` table), on the command
line (`--policy-settings gittins.guard=false`), in a retune and in `fsd.LLM(...)`. The
registry hands this module its table of policies; nothing here names one.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fsd.config_checks import check_types, help_of
from fsd.errors import ConfigError

_WORDS = {**dict.fromkeys(("true", "on", "yes", "1"), True),
          **dict.fromkeys(("false", "off", "no", "0"), False)}  # fmt: skip


def declared(types: Mapping[str, type | None]) -> dict[str, tuple[str, dataclasses.Field]]:
    """`POLICY.FIELD` -> (policy, field) for every policy's every setting."""
    return {
        f"{policy}.{f.name}": (policy, f)
        for policy, cls in types.items()
        if cls is not None
        for f in dataclasses.fields(cls)
    }


def check_names(names: Iterable[str], types: Mapping[str, type | None]) -> None:
    """ConfigError naming each unknown setting (with the nearest known one, for a typo)."""
    known = declared(types)
    unknown = sorted(n for n in names if n not in known)
    if unknown:
        near = [m for n in unknown for m in difflib.get_close_matches(n, known, 1)]
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        listed = ", ".join(known) or "none: no policy declares settings"
        raise ConfigError(f"unknown policy setting {', '.join(unknown)}{hint}; known: {listed}")


def own_settings(pairs: Iterable[tuple[str, Any]], policy: str, cls: type | None) -> Any:
    """`policy`'s settings object: its defaults with the values `pairs` give it (a text
    value, from a command line, read as the field's type); ConfigError if one is bad."""
    if cls is None:
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    given = {}
    for name, value in pairs:
        owner, _, field = name.partition(".")
        if owner == policy and field in fields:
            given[field] = _typed(name, value, str(fields[field].type))
    try:
        settings = cls(**given)
        check_types(settings)
    except ConfigError as exc:
        raise ConfigError(f"{policy} setting {exc}") from None
    return settings


def check_values(pairs: Iterable[tuple[str, Any]], types: Mapping[str, type | None]) -> None:
    """Every name known and every policy's values valid, whichever policy runs now (a
    retune to another policy must not meet a bad value)."""
    pairs = list(pairs)
    check_names((name for name, _ in pairs), types)
    for policy in {name.partition(".")[0] for name, _ in pairs}:
        own_settings(pairs, policy, types[policy])


def settings_help(types: Mapping[str, type | None]) -> str:
    """One line per setting for a command's help: its name, default and help."""
    lines = [
        f"{name} (default {f.default}): {help_of(types[policy], f.name)}"  # type: ignore[arg-type]
        for name, (policy, f) in declared(types).items()
    ]
    return "; ".join(lines) if lines else "no policy declares settings"


def _boolean(text: str) -> bool:
    return _WORDS[text]  # KeyError: not a word for on or off


# how a text value is read, by the first of these words in the field's type
_PARSERS: tuple[tuple[str, Callable[[str], Any]], ...] = (
    ("bool", _boolean), ("int", int), ("float", float),
)  # fmt: skip


def _typed(name: str, value: Any, kind: str) -> Any:
    """A text value as the field's type (`int`, `float`, `bool`, `... | None`)."""
    if not isinstance(value, str) or kind == "str":
        return value
    text = value.strip().lower()
    if "None" in kind and text == "none":
        return None
    parse = next((p for word, p in _PARSERS if word in kind), lambda _: value)
    try:
        return parse(text)
    except (KeyError, ValueError):
        raise ConfigError(f"{name} must be {kind}, got {value!r}") from None
