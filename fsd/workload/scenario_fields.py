"""Typed reads of TOML tables whose errors name the file, the field and the value.

`Fields(table, "phase[1]", "steady.toml").number("rate", above=0)` either returns the
value or raises `ConfigError("steady.toml: phase[1].rate: must be > 0, got -1")`.
Unknown keys are refused by `only(...)`, so a typo never passes silently.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from fsd.errors import ConfigError
from fsd.workload.length_models import Fixed, LengthModel, Lengths, Lognormal, Zipf, length_model

_MISSING = object()


class Fields:
    """One TOML table of a scenario file, with the path that names it in errors."""

    def __init__(self, raw: dict[str, Any], prefix: str, source: str) -> None:
        self.raw = raw
        self.prefix = prefix
        self.source = source

    def where(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.where(key)}: {message}")

    def only(self, *allowed: str) -> None:
        unknown = [k for k in self.raw if k not in allowed]
        if unknown:
            raise self.fail(unknown[0], f"unknown field (valid here: {', '.join(allowed)})")

    def forbid(self, *keys: str, why: str) -> None:
        for key in keys:
            if key in self.raw:
                raise self.fail(key, f"not allowed here: {why} (got {self.raw[key]!r})")

    def _get(self, key: str, required: bool, default: Any) -> Any:
        if key in self.raw:
            return self.raw[key]
        if required:
            raise self.fail(key, "is required")
        return _MISSING if default is _MISSING else default

    def number(
        self,
        key: str,
        *,
        required: bool = False,
        default: Any = None,
        above: float | None = None,
        at_least: float | None = None,
        integer: bool = False,
    ) -> Any:
        value = self._get(key, required, default)
        if key not in self.raw:
            return value
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            kind = "a whole number" if integer else "a number"
            raise self.fail(key, f"must be {kind}, got {value!r}")
        if not math.isfinite(value):
            raise self.fail(key, f"must be finite, got {value!r}")
        if above is not None and not value > above:
            raise self.fail(key, f"must be > {above:g}, got {value!r}")
        if at_least is not None and not value >= at_least:
            raise self.fail(key, f"must be >= {at_least:g}, got {value!r}")
        return value if integer else float(value)

    def optional_int(self, key: str, at_least: int) -> int | None:
        value = self.number(key, default=None, integer=True, at_least=at_least)
        return None if value is None else int(value)

    def string(self, key: str, *, required: bool = False, default: Any = None) -> Any:
        value = self._get(key, required, default)
        if key in self.raw and not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {value!r}")
        return value

    def choice(
        self, key: str, choices: tuple[str, ...], *, required: bool = False, default: Any = None
    ) -> Any:
        value = self.string(key, required=required, default=default)
        if key in self.raw and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def table(self, key: str, *, required: bool = False) -> Fields:
        value = self._get(key, required, {})
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {value!r}")
        return Fields(value, self.where(key), self.source)

    def tables(self, key: str) -> list[Fields]:
        """An array of tables (`[[phase]]`); each named `key[i]` in errors."""
        value = self._get(key, False, [])
        if isinstance(value, dict) or not isinstance(value, list):
            raise self.fail(key, f"must be an array of tables ([[{key}]]), got {value!r}")
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise self.fail(f"{key}[{i}]", f"must be a table, got {item!r}")
            prefix = f"{self.prefix}.{key}[{i}]" if self.prefix else f"{key}[{i}]"
            out.append(Fields(item, prefix, self.source))
        return out


# ---- length models -----------------------------------------------------------------


def parse_lengths(t: Fields, key: str, *, required: bool = False) -> Lengths | None:
    """A preset name (`"sharegpt"`), a preset table (`{preset = "zipf", theta = 1.3}`)
    or explicit distributions (`{prompt = {...}, output = {...}, max_context = N}`)."""
    if key not in t.raw:
        if required:
            raise t.fail(key, "is required (a preset name or a table of prompt/output)")
        return None
    value = t.raw[key]
    try:
        if isinstance(value, str):
            return length_model(value)
        if not isinstance(value, dict):
            raise t.fail(key, f"must be a preset name or a table, got {value!r}")
        sub = t.table(key)
        if "preset" in sub.raw:
            sub.only("preset", "theta", "max_context", "max_output")
            theta = sub.number("theta", default=None, above=0)
            model = length_model(sub.string("preset"), theta)
        else:
            sub.only("prompt", "output", "max_context", "max_output")
            model = LengthModel(
                "custom", _dist(sub, "prompt"), _dist(sub, "output"), max_context=None
            )
        ctx = sub.optional_int("max_context", at_least=2)
        out = sub.optional_int("max_output", at_least=1)
        if ctx is not None or out is not None:  # replace: a LengthModel or a Mixture
            model = replace(
                model,
                max_context=ctx if ctx is not None else model.max_context,
                max_output=out if out is not None else model.max_output,
            )
        return model
    except ConfigError as exc:
        if str(exc).startswith(f"{t.source}: "):
            raise
        raise t.fail(key, str(exc)) from None


def _dist(t: Fields, key: str) -> Lognormal | Zipf | Fixed:
    value = t._get(key, True, None)
    if isinstance(value, int) and not isinstance(value, bool):
        return Fixed(value)
    d = t.table(key)
    kind = d.choice("dist", ("lognormal", "zipf", "fixed"), required=True)
    try:
        if kind == "lognormal":
            d.only("dist", "mean", "sigma")
            return Lognormal(d.number("mean", required=True), d.number("sigma", default=0.0))
        if kind == "zipf":
            d.only("dist", "theta", "high", "low")
            return Zipf(
                d.number("theta", required=True),
                int(d.number("high", required=True, integer=True)),
                int(d.number("low", default=1, integer=True)),
            )
        d.only("dist", "value")
        return Fixed(int(d.number("value", required=True, integer=True)))
    except ConfigError as exc:
        if str(exc).startswith(f"{t.source}: "):
            raise
        raise t.fail(key, str(exc)) from None
