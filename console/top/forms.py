"""The retune and inject dialogs' validation: form text in, wire values out (no widgets).

Every error names the field and says what is wrong, so the dialog can show it
beside the field and the operator can fix it without guessing.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsd import protocol as P
from fsd.config import MAX_LEVELS, MAX_QUANTUM_RATIO, MAX_RESERVE_JOBS, MAX_SECONDS
from fsd.errors import ConfigError
from fsd.sched.registry import settings_types

_PER_SECOND = {"": 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6}  # divide: 9/1e3 == 0.009
_SECONDS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(s|ms|us|µs)?\s*$", re.I)


class FormError(ValueError):
    """A field the operator must fix; `field` names the form field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def parse_seconds(field: str, text: str) -> float:
    """'0.01', '10ms', '250us', '1.5s' → seconds (> 0, at most a day as fsd.config says)."""
    m = _SECONDS.match(text)
    if m is None:
        raise FormError(field, f"{text.strip()!r} is not a duration (e.g. 0.01, 10ms, 250us)")
    value = float(m.group(1)) / _PER_SECOND[(m.group(2) or "").lower()]
    if not value > 0 or not math.isfinite(value):
        raise FormError(field, "must be > 0")
    if value > MAX_SECONDS:
        raise FormError(field, f"must be <= {MAX_SECONDS:g}s (one day), got {fmt_seconds(value)}")
    return value


def parse_quanta(field: str, text: str) -> list[float]:
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    if not parts:
        raise FormError(field, "list at least one quantum, e.g. 2ms,4ms,8ms")
    quanta = [parse_seconds(field, p) for p in parts]
    for a, b in zip(quanta, quanta[1:], strict=False):
        if b <= a:
            raise FormError(field, f"must be strictly increasing ({fmt_seconds(b)} after {fmt_seconds(a)})")  # fmt: skip
    return quanta


def parse_int(field: str, text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise FormError(field, f"{text.strip()!r} is not a whole number") from None
    if value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise FormError(field, f"must be {span}, got {value}")
    return value


def _parse_number(field: str, text: str, ok: Callable[[float], bool], rule: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise FormError(field, f"{text.strip()!r} is not a number") from None
    if not ok(value):
        raise FormError(field, f"must be {rule}, got {text.strip()}")
    return value


def parse_ratio(field: str, text: str) -> float:
    value = _parse_number(field, text, lambda v: v > 1 and math.isfinite(v), "> 1")
    if value > MAX_QUANTUM_RATIO:
        raise FormError(field, f"must be <= {MAX_QUANTUM_RATIO:g}, got {text.strip()}")
    return value


def parse_fraction(field: str, text: str) -> float:
    return _parse_number(field, text, lambda v: 0 < v <= 1, "in (0, 1]")


def alpha_setting(policy: str) -> str | None:
    """The policy's own alpha (`fsd.alpha`, in SLOs); None for a policy without one."""
    own = settings_types().get(policy)
    if own is None or "alpha" not in {f.name for f in dataclasses.fields(own)}:
        return None
    return f"{policy}.alpha"


def current_alpha(policy: str, settings: Any) -> float | None:
    """The policy's alpha in SLOs: as `settings` (the config's `policy_settings`
    pairs) set it, else the policy's own default; None for a policy without one."""
    name = alpha_setting(policy)
    if name is None:
        return None
    for pair in settings or ():
        if isinstance(pair, list | tuple) and len(pair) == 2 and pair[0] == name:
            try:
                return float(pair[1])
            except (TypeError, ValueError):
                break
    return float(settings_types()[policy].__dataclass_fields__["alpha"].default)  # type: ignore[union-attr]


def parse_alpha(field: str, text: str, policy: str) -> float:
    """An alpha in SLOs for `policy`, checked by the policy's own settings (its bound)."""
    value = _parse_number(field, text, lambda v: v > 0 and math.isfinite(v), "> 0 SLOs")
    try:
        settings_types()[policy](alpha=value)  # type: ignore[misc]
    except ConfigError as exc:
        raise FormError(field, str(exc).removeprefix("alpha ")) from None
    return value


def fmt_seconds(x: float) -> str:
    """Seconds as the form shows them: '2.464ms', '1.5s'."""
    return f"{x * 1e3:.4g}ms" if x < 1 else f"{x:.4g}s"


@dataclass(frozen=True)
class RetuneForm:
    """The retune dialog's fields, as text. `mode` picks explicit quanta or q1 × ratio;
    `alpha` is the form's policy's own (`fsd.alpha`), in SLOs."""

    mode: str = "ratio"  # "quanta" | "ratio"
    quanta: str = ""
    q1: str = ""
    ratio: str = "2"
    alpha: str = ""
    k: str = "4"
    k_prime: str = "2"
    admit: str = "0.9"
    policy: str = ""
    kv_policy: str = ""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RetuneForm:
        """The form filled with the daemon's live settings (a snapshot's `config`)."""
        sched = config.get("sched", {})
        cache = config.get("cache", {})
        eff = config.get("effective", {})
        quanta = eff.get("quanta") or sched.get("quanta") or []
        q1 = sched.get("q1") or (quanta[0] if quanta else None)
        policy = sched.get("policy", "")
        policy = eff.get("policy") if policy == "default" and eff.get("policy") else policy
        alpha = current_alpha(policy, sched.get("policy_settings"))
        return cls(
            mode="quanta" if sched.get("quanta") else "ratio",
            quanta=",".join(fmt_seconds(q) for q in quanta),
            q1=fmt_seconds(q1) if q1 else "",
            ratio=f"{sched.get('quantum_ratio', 2.0):g}",
            alpha=f"{alpha:g}" if alpha is not None else "",
            k=str(cache.get("reserve_min_jobs", 4)),
            k_prime=str(cache.get("reserve_top_levels", 2)),
            admit=f"{cache.get('admit_fraction', 0.9):g}",
            policy=policy,
            kv_policy=cache.get("kv_policy", ""),
        )

    def values(self) -> dict[str, Any]:
        """Parsed fields (FormError on the first bad one); blank optional fields are None."""
        out: dict[str, Any] = {"policy": self.policy or None, "kv_policy": self.kv_policy or None}
        if self.mode == "quanta":
            out["quanta"] = parse_quanta("quanta", self.quanta)
        elif self.mode == "ratio":
            out["q1"] = parse_seconds("q1", self.q1) if self.q1.strip() else None
            out["quantum_ratio"] = parse_ratio("ratio", self.ratio)
        else:
            raise FormError("mode", f"unknown mode {self.mode!r}")
        alpha = alpha_setting(self.policy)
        if alpha is not None and self.alpha.strip():  # (a policy without one: no alpha)
            out[alpha] = parse_alpha("alpha", self.alpha, self.policy)
        out["reserve_min_jobs"] = parse_int("K", self.k, 0, MAX_RESERVE_JOBS)
        out["reserve_top_levels"] = parse_int("K'", self.k_prime, 0, MAX_LEVELS)
        out["admit_fraction"] = parse_fraction("admit", self.admit)
        return out


def retune_changes(form: RetuneForm, current: RetuneForm) -> dict[str, Any]:
    """The settings `form` changes relative to `current` (both as the dialog holds them).

    Switching from explicit quanta to q1 × ratio clears the quanta, or they would
    keep overriding q1. The alpha is sent only when edited (a policy switched to keeps
    its own). Raises FormError for a bad field or when nothing changed.
    """
    edited = form.alpha.strip() != current.alpha.strip()
    if edited and form.alpha.strip() and alpha_setting(form.policy) is None:
        raise FormError("alpha", f"policy {form.policy or '(none)'} has no alpha; clear it")
    new = form.values()
    # Compare with the current form read the same way, so untouched fields never count.
    try:
        old = dataclasses.replace(current, mode=form.mode).values()
    except FormError:
        old = {}
    changes = {k: v for k, v in new.items() if v is not None and old.get(k) != v}
    if not edited:
        changes = {k: v for k, v in changes.items() if k != alpha_setting(form.policy)}
    if form.mode == "ratio" and current.mode == "quanta":
        changes["quanta"] = None
        changes.setdefault("quantum_ratio", new["quantum_ratio"])
        if new.get("q1") is not None:
            changes["q1"] = new["q1"]
    if not changes:
        raise FormError("form", "nothing changed")
    return changes


def burst(count: str, input_len: str, output_len: str) -> P.Burst:
    """An inline burst from the inject dialog's fields."""
    return P.Burst(
        count=parse_int("count", count, 1, 10_000),
        input_len=parse_int("input tokens", input_len, 1),
        output_len=parse_int("output tokens", output_len, 1),
    )


def tag(text: str) -> str:
    value = text.strip()
    if not value or not re.fullmatch(r"[\w.:-]+", value):
        raise FormError("tag", "use letters, digits and . _ : - (e.g. injected)")
    return value
