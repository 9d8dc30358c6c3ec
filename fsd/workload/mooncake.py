"""Mooncake trace reader: arrivals, token counts and prefix block hashes from JSON Lines.

The Mooncake (Kimi) traces (FAST'25 release: conversation, tool&agent, synthetic) hold
one JSON object a line: `timestamp` (milliseconds from the trace's start, >= 0),
`input_length` (prompt tokens, >= 1), `output_length` (generated tokens, >= 0) and
`hash_ids` (the prompt's 512-token prefix blocks, remapped to integers: equal ids in two
requests mean a shared prefix, the reuse a prefix cache can exploit). Other keys are
ignored; blank lines are skipped.

Conventions are `read_trace`'s (fsd.workload.trace): arrivals from 0 in seconds,
`time_scale` multiplies the arrival rate (0.5 = half the rate), `limit` keeps the first
`limit` requests of the file, a request that generated 0 tokens is given 1 (counted in
params as `zero_outputs`), and anything that does not parse stops the read with a
`ConfigError` naming the file, the line (1 = the first) and the field.

Order: the released traces are sorted by timestamp, but the format does not promise it
(a hand-cut or merged file may not be), so the rows are sorted stably by time, as
`read_trace` does: equal timestamps keep file order, and each request's hash ids travel
with it (into `Workload.prefix_hashes`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TextIO

from fsd.errors import ConfigError
from fsd.workload.spec import Request, Workload, check_time_scale
from fsd.workload.trace import TraceRef

MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS = 512  # the prompt tokens one hash id covers
_MS = 1e-3  # timestamps are milliseconds

Row = tuple[float, int, int, tuple[int, ...]]  # (time s, prompt, output, hash ids)


def read_mooncake(
    path: str | Path | TraceRef, time_scale: float = 1.0, limit: int | None = None
) -> Workload:
    """Read a Mooncake JSONL trace into a `Workload` with its prefix hashes (see the
    module doc); `limit` keeps the first `limit` requests."""
    check_time_scale(time_scale)
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be >= 1 request, got {limit}")
    ref = path if isinstance(path, TraceRef) else TraceRef(str(path), path=Path(path))
    p = ref.path or Path(ref.name)  # how errors name it
    with _open(ref, p) as handle:
        rows, zero_outputs = _read_rows(handle, p, limit)
    if not rows:
        raise ConfigError(f"{p}: the trace has no requests")
    rows.sort(key=lambda r: r[0])  # stable: equal timestamps keep file order
    t0 = rows[0][0]
    reqs = tuple(Request((t - t0) / time_scale, n, m) for t, n, m, _ in rows)
    params: dict[str, object] = {"trace": str(p), "format": "mooncake", "time_scale": time_scale}
    if limit is not None:
        params["limit"] = limit
    if zero_outputs:
        params["zero_outputs"] = zero_outputs
    return Workload(reqs, source=p.name, params=params, prefix_hashes=tuple(r[3] for r in rows))


def _open(ref: TraceRef, p: Path) -> TextIO:
    try:
        return ref.open()
    except FileNotFoundError:
        raise ConfigError(f"trace file {str(p)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"trace file {str(p)!r} cannot be read: {exc.strerror}") from None


def _read_rows(handle: TextIO, p: Path, limit: int | None) -> tuple[list[Row], int]:
    """Each request's row (up to `limit`), and how many generated 0 tokens (given 1)."""
    rows: list[Row] = []
    zero_outputs = 0
    lineno = 0
    lines = iter(handle)
    while limit is None or len(rows) < limit:
        try:
            line = next(lines)
        except StopIteration:
            break
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{p}:{lineno + 1}: not UTF-8 text: {exc.reason}") from None
        lineno += 1
        if not line.strip():
            continue  # blank line
        t, prompt, output, hashes = _parse_line(p, lineno, line)
        if output == 0:
            zero_outputs += 1
            output = 1
        rows.append((t, prompt, output, hashes))
    return rows, zero_outputs


def _parse_line(p: Path, lineno: int, line: str) -> Row:
    """One line's arrival (s), prompt tokens, output tokens (0 allowed) and hash ids."""
    where = f"{p}:{lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {_kind(obj)}")
    missing = [f for f in MOONCAKE_FIELDS if f not in obj]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(missing)}")
    stamp = obj["timestamp"]
    if not _is_number(stamp) or not math.isfinite(stamp) or stamp < 0:
        raise ConfigError(
            f"{where}: field timestamp: {stamp!r} is not a finite number of milliseconds >= 0"
        )
    prompt = _count(where, "input_length", obj["input_length"], minimum=1)
    output = _count(where, "output_length", obj["output_length"], minimum=0)
    hashes = _hash_ids(where, obj["hash_ids"])
    blocks = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    if hashes and len(hashes) != blocks:  # (none at all: a request without prefix data)
        raise ConfigError(
            f"{where}: field hash_ids: {len(hashes)} ids for a prompt of {prompt} tokens, "
            f"which takes {blocks} blocks of {MOONCAKE_BLOCK_TOKENS}"
        )
    return stamp * _MS, prompt, output, hashes


def _count(where: str, field: str, value: Any, minimum: int) -> int:
    if not _is_int(value):
        raise ConfigError(f"{where}: field {field}: {value!r} is not a whole number of tokens")
    if value < minimum:
        raise ConfigError(f"{where}: field {field}: {value} must be >= {minimum}")
    return int(value)


def _hash_ids(where: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: field hash_ids: expected a list of integers, got {value!r}")
    for i, item in enumerate(value):
        if not _is_int(item):
            raise ConfigError(f"{where}: field hash_ids: item {i} ({item!r}) is not an integer")
    return tuple(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no count


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string"}.get(type(value), repr(value))
