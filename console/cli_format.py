"""How `fsctl` parses settings and prints the daemon's answers (no sockets here)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from rich.table import Table
from rich.text import Text

from fsd import protocol as P
from fsd.client import generation_rate
from fsd.config import CacheConfig, SchedConfig
from fsd.console.top.forms import FormError, parse_quanta, parse_seconds
from fsd.errors import ConfigError
from fsd.printable import shown
from fsd.sched.registry import settings_types

_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def parse_scalar(text: str) -> Any:
    """'3' → 3, '0.5' → 0.5, 'true' → True, 'none' → None, anything else → the string."""
    word = text.strip()
    low = word.lower()
    if low in _WORDS:
        return _WORDS[low]
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    return word


def parse_value(text: str) -> Any:
    """A scalar, or a comma-separated list of scalars ('0.01,0.02' or '4,')."""
    if "," in text:
        return [parse_scalar(part) for part in text.split(",") if part.strip()]
    return parse_scalar(text)


RETUNE_SECONDS = frozenset({"quanta", "q1"})  # retunable settings measured in seconds
# and the effective alphas telemetry shows in seconds (a policy's alpha is set in SLOs)
SECONDS_KEYS = RETUNE_SECONDS | {"starve_limit", "starve_limit_waiting"}


def _bools(config: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config) if f.type in ("bool", bool)}


# on/off settings (prefix_cache, fsd.swap_gate): a word such as true or off, nothing else
BOOL_KEYS = frozenset(
    {name for config in (CacheConfig, SchedConfig) for name in _bools(config)}
    | {
        f"{policy}.{name}"
        for policy, own in settings_types().items()
        if own is not None
        for name in _bools(own)
    }
)


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """['policy=fcfs', 'quanta=10ms,20ms'] → {'policy': 'fcfs', 'quanta': [0.01, 0.02]}.

    Durations (RETUNE_SECONDS) take a unit as the console's retune form does: 0.01,
    10ms, 250us, 1.5s; quanta is a list, or none. `KEY=none` resets an optional setting.
    On/off settings (BOOL_KEYS) take true/false, yes/no or on/off. A policy's own
    setting is `POLICY.FIELD` (`fsd.alpha=50`: alphas are in SLOs, not seconds).
    """
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}")
        if key in RETUNE_SECONDS:
            changes[key] = _seconds(key, value)
        elif key in BOOL_KEYS:
            changes[key] = parse_bool(key, value)
        else:
            changes[key] = parse_value(value)
    return changes


def parse_bool(key: str, text: str) -> bool:
    """'true', 'on', 'yes' → True; 'false', 'off', 'no' → False (any case); else an error."""
    value = _WORDS.get(text.strip().lower())
    if value is None:
        raise ConfigError(f"{key} takes true or false (or on/off, yes/no), got {text.strip()!r}")
    return value


def _seconds(key: str, text: str) -> Any:
    """The retune form's own parsers; 'none' puts the setting back to its default (for
    quanta: the levels q1 and quantum_ratio derive, as when quanta was never set)."""
    if parse_scalar(text) is None:
        return None
    try:
        return parse_quanta(key, text) if key == "quanta" else parse_seconds(key, text)
    except FormError as exc:
        raise ConfigError(str(exc)) from None


def injected_summary(ids: list[str], tag: str, show: int = 8) -> str:
    """'injected 3 jobs (tag t): a b c'; beyond `show` ids only the first and the last."""
    listed = " ".join(ids) if len(ids) <= show else f"{ids[0]} .. {ids[-1]}"
    return f"injected {len(ids)} jobs (tag {tag})" + (f": {listed}" if ids else "")


def find_setting(config: dict[str, Any], key: str) -> tuple[bool, Any]:
    """A key of a (possibly sectioned) config dict: its top level first, then sections;
    a policy's own setting (`fsd.alpha`) among the `policy_settings` pairs."""
    if key in config:
        return True, config[key]
    for pair in config.get("policy_settings") or ():
        if isinstance(pair, list | tuple) and len(pair) == 2 and pair[0] == key:
            return True, pair[1]
    for value in config.values():
        if isinstance(value, dict):
            found, inner = find_setting(value, key)
            if found:
                return True, inner
    return False, None


def level_name(level: int) -> str:
    """A wire level (1-based since protocol v2) as operators name it: 1 → 'Q1'."""
    return f"Q{level}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1e3:.1f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{sec:02d}s"


def _count(n: int) -> str:
    """A token count for a narrow cell: as is below 100k, else in thousands (131k)."""
    return str(n) if n < 100_000 else f"{n // 1000}k"


def prefill_progress(prefilled: int | None, prompt: int) -> str:
    """'512/2048' while a job's prompt is partly prefilled (between the chunks of a
    chunked prefill); '' before it starts, once it is done, or from an older daemon."""
    if prefilled is None or not 0 < prefilled < prompt:
        return ""
    return f"{_count(prefilled)}/{_count(prompt)}"


def prefill_detail(prefilled: int, prompt: int) -> str:
    """'512/2048 tokens (25%)', or 'done' once the whole prompt's KV is cached."""
    if prefilled >= prompt:
        return "done"
    return f"{prefilled}/{prompt} tokens ({prefilled * 100 // max(prompt, 1)}%)"


def status_lines(s: P.StatusReply) -> list[str]:
    return [
        f"fsd {s.version}  pid {s.pid}  up {duration(s.uptime)}",
        f"model       {s.model}",
        f"policy      {s.policy}  (kv: {s.kv_policy})",
        f"jobs        {s.jobs}  ({s.running} running)",
        f"iterations  {s.iterations}",
        f"draining    {'yes' if s.draining else 'no'}",
        f"degraded    {s.degraded or 'no'}",
    ]


def jobs_table(jobs: list[P.JobInfo]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("JOB", "STATE", "LVL", "KV", "BLOCKS", "ENST", "PROMPT", "PREFILL", "OUT", "WAITED"):  # fmt: skip
        table.add_column(name, no_wrap=True, justify="left" if name in ("JOB", "STATE", "KV") else "right")  # fmt: skip
    table.add_column("PREEMPT", justify="right", no_wrap=True)
    table.add_column("TAGS", overflow="fold")
    for j in jobs:
        table.add_row(
            j.job_id,
            j.state,
            level_name(j.level),
            j.kv,
            f"{j.blocks}/{j.host_blocks}",
            duration(j.enst),
            str(j.prompt_tokens),
            prefill_progress(j.prefilled, j.prompt_tokens) or "-",
            str(j.output_tokens),
            duration(j.waited),
            str(j.preemptions),
            Text(shown(",".join(j.tags))),  # a client's words: no markup, nothing obeyed
        )
    return table


def detail_line(key: str, value: object) -> str:
    """One `key  value` line of a job's detail (the key in a column of 12)."""
    return f"{key:<12}{value}"


def job_lines(j: P.JobInfo) -> list[str]:
    """One job in detail, a line per figure: `fsctl job` and the console's job screen."""
    # no prefill line for a job from a daemon that does not report it
    prefill = (
        [] if j.prefilled is None else [("prefill", prefill_detail(j.prefilled, j.prompt_tokens))]
    )
    rank = [] if j.rank is None else [("rank", f"{j.rank} (1 runs first)")]
    cached = f" ({j.cached_tokens} from the prefix cache)" if j.cached_tokens else ""
    rows = [
        ("job", j.job_id),
        ("state", j.state),
        ("level", level_name(j.level)),
        *rank,
        ("kv", f"{j.kv} ({j.blocks} device blocks, {j.host_blocks} host blocks)"),
        ("enst", duration(j.enst)),
        ("tokens", f"{j.prompt_tokens} prompt{cached}, {j.output_tokens} output"),
        *prefill,
        ("waited", duration(j.waited)),
        ("attained", duration(j.attained)),
        ("arrival", clock(j.arrival)),
        ("preemptions", j.preemptions),
        ("swaps", f"{j.swaps_out} out, {j.swaps_in} in, {j.recomputes} recomputes"),
        ("moves", f"{j.promotions} promotions, {j.demotions} demotions"),
        ("tags", shown(", ".join(j.tags)) or "-"),
    ]
    return [detail_line(k, v) for k, v in rows]


def clock(t: float) -> str:
    """Wall-clock time of day with milliseconds (local time)."""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


def snapshot_line(s: P.Snapshot) -> str:
    queues = " ".join(str(len(lv.job_ids)) for lv in s.levels)
    jobs = sum(len(lv.job_ids) for lv in s.levels)
    running = "-" if s.jobs is None else sum(1 for j in s.jobs if j.state == "running")
    kv, slo = s.kv, s.slo
    ptl = duration(slo.p95_per_token_latency)
    return (
        f"{clock(s.time)} snapshot #{s.seq} policy={s.policy} jobs={jobs} "
        f"running={running} queues=[{queues}] kv={kv.device_used}/{kv.device_total} "
        f"reserved={kv.device_reserved} host={kv.host_used}/{kv.host_total} "
        f"inflight={kv.bytes_in_flight}B tok/s={generation_rate(s):.1f} p95-ptl={ptl}"
        + ("" if s.prefix is None else f" prefix-hit={prefix_hit(s.prefix)}")
    )


def percent(fraction: float) -> str:
    """0.634 → '63%' (a share of tokens: no decimals)."""
    return f"{fraction * 100:.0f}%"


def prefix_hit(p: P.PrefixInfo) -> str:
    """The prefix cache's hit rate over every token queried since start, or 'off'."""
    return percent(p.hit_rate) if p.enabled else "off"


def event_line(e: P.Event) -> str:
    detail = " ".join(f"{k}={level_name(v) if k == 'level' else v}" for k, v in e.detail.items())
    line = " ".join(p for p in (clock(e.time), "event", e.kind, e.job_id or "", detail) if p)
    return shown(line)


def telemetry_line(msg: P.Snapshot | P.Event) -> str:
    return snapshot_line(msg) if isinstance(msg, P.Snapshot) else event_line(msg)


def completion_stats(c: Any) -> str:
    """One stderr line after `fsctl submit --stats` (c: fsd.client.Completion)."""
    n = len(c.token_ids)
    lat = c.latency
    rate = f"{n / lat:.1f} tok/s" if lat else "-"
    return (
        f"{c.job_id}: {n} tokens, finish={c.finish_reason}, ttft={duration(c.ttft)}, "
        f"latency={duration(lat)}, {rate}, preemptions={c.preemptions}, "
        f"swaps={c.swaps_out}/{c.swaps_in}, recomputes={c.recomputes}, "
        f"cached={c.cached_tokens}"
    )
