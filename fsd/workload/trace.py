"""Trace readers: request arrival times and token counts from recorded production traffic.

The Azure LLM inference traces (2023: conversation and code; 2024 likewise) are CSV
files with a header `TIMESTAMP,ContextTokens,GeneratedTokens`, one request per line.
TIMESTAMP is a wall-clock time like `2023-11-16 18:15:46.6805900` (any number of
fractional digits) or a plain number of seconds; ContextTokens is the prompt length
and GeneratedTokens the output length.

Time scale: `time_scale` multiplies the arrival *rate*. A request recorded `t`
seconds after the first one arrives at `t / time_scale`: 0.5 = half the rate (every
gap stretched by 1 / 0.5 = 2x), 2 = twice the rate. Token counts are untouched.

A request that generated 0 tokens is given 1 (per-token latency needs an output
token); the count is kept in the workload's params as `zero_outputs`. Anything else
that does not parse stops the read with a `ConfigError` naming the file, the line
number (1 = the header) and the field.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fsd.errors import ConfigError
from fsd.workload.spec import Request, Workload, check_time_scale

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_EPOCH = dt.datetime(1970, 1, 1)


@dataclass(frozen=True)
class TraceRef:
    """A trace as a scenario names it: a file on this machine, or its text sent inline.

    The daemon only ever sees inline traces (`path` None): it never opens a path a
    client names. `name` is the scenario's `trace = "..."` value, used in errors.
    """

    name: str
    path: Path | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.text is None):
            raise ValueError("a TraceRef has exactly one of path and text")

    def open(self) -> TextIO:
        if self.text is not None:
            return io.StringIO(self.text, newline="")
        assert self.path is not None
        return self.path.open(newline="")

    def __str__(self) -> str:
        return str(self.path) if self.path is not None else self.name


def parse_timestamp(text: str) -> float:
    """Seconds (since 1970 for wall-clock times) from `YYYY-MM-DD HH:MM:SS[.fff...]` or a number."""
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"timestamp {s!r} is not finite")
        return value
    head, _, frac = s.partition(".")
    when = dt.datetime.strptime(head.replace("T", " "), "%Y-%m-%d %H:%M:%S")
    seconds = (when - _EPOCH).total_seconds()
    if frac:
        if not frac.isdigit():
            raise ValueError(f"bad fractional seconds {frac!r}")
        seconds += int(frac) / 10 ** len(frac)
    return seconds


def read_trace(
    path: str | Path | TraceRef,
    time_scale: float = 1.0,
    limit: int | None = None,
    columns: tuple[str, str, str] = AZURE_COLUMNS,
) -> Workload:
    """Read a trace CSV into a `Workload` (arrivals from 0, scaled by `time_scale`).

    `limit` keeps the first `limit` requests (a fast slice for tests and sweeps);
    `columns` names the (time, prompt tokens, output tokens) columns.
    """
    check_time_scale(time_scale)
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be >= 1 request, got {limit}")
    ref = path if isinstance(path, TraceRef) else TraceRef(str(path), path=Path(path))
    p = ref.path or Path(ref.name)  # how errors name it
    try:
        handle = ref.open()
    except FileNotFoundError:
        raise ConfigError(f"trace file {str(p)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"trace file {str(p)!r} cannot be read: {exc.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        indices, num_fields = _header_indices(reader, p, columns)
        rows, zero_outputs = _read_rows(reader, p, columns, indices, num_fields, limit)
    if not rows:
        raise ConfigError(f"{p}: the trace has a header but no requests")
    rows.sort(key=lambda r: r[0])  # stable: equal timestamps keep file order
    t0 = rows[0][0]
    reqs = tuple(Request((t - t0) / time_scale, n, m) for t, n, m in rows)
    params: dict[str, object] = {"trace": str(p), "time_scale": time_scale}
    if limit is not None:
        params["limit"] = limit
    if zero_outputs:
        params["zero_outputs"] = zero_outputs
    return Workload(reqs, source=p.name, params=params)


def _header_indices(
    reader: Any, p: Path, columns: tuple[str, str, str]
) -> tuple[tuple[int, int, int], int]:
    """The (time, prompt, output) column indices from the header line, and its field count."""
    try:
        header = next(reader)
    except StopIteration:
        raise ConfigError(f"{p}: the trace is empty (no header line)") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}:1: not a CSV header: {exc}") from None
    names = [h.strip().lstrip("\ufeff") for h in header]
    missing = [c for c in columns if c not in names]
    if missing:
        raise ConfigError(
            f"{p}:1: header lacks column(s) {', '.join(missing)} "
            f"(has {', '.join(names) or 'nothing'})"
        )
    ti, pi, oi = (names.index(c) for c in columns)
    return (ti, pi, oi), len(names)


def _read_rows(
    reader: Any,
    p: Path,
    columns: tuple[str, str, str],
    indices: tuple[int, int, int],
    num_fields: int,
    limit: int | None,
) -> tuple[list[tuple[float, int, int]], int]:
    """The (time, prompt, output) of each request after the header (up to `limit`), and
    how many generated 0 tokens (given 1)."""
    rows: list[tuple[float, int, int]] = []
    zero_outputs = 0
    width = max(indices) + 1
    while limit is None or len(rows) < limit:
        try:
            row = next(reader)
        except StopIteration:
            break
        except (csv.Error, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}:{reader.line_num}: not valid CSV: {exc}") from None
        if not row or all(not c.strip() for c in row):
            continue  # blank line
        if len(row) < width:
            raise ConfigError(
                f"{p}:{reader.line_num}: expected {num_fields} fields, got {len(row)} "
                f"({','.join(row)!r})"
            )
        t, prompt, output = _parse_row(p, reader.line_num, row, columns, indices)
        if output == 0:
            zero_outputs += 1
            output = 1
        rows.append((t, prompt, output))
    return rows, zero_outputs


def _parse_row(
    p: Path,
    lineno: int,
    row: list[str],
    columns: tuple[str, str, str],
    indices: tuple[int, int, int],
) -> tuple[float, int, int]:
    """One row's timestamp, prompt tokens and output tokens (0 allowed)."""
    ti, pi, oi = indices
    try:
        t = parse_timestamp(row[ti])
    except ValueError:
        raise ConfigError(
            f"{p}:{lineno}: field {columns[0]}: {row[ti]!r} is not a timestamp"
        ) from None
    prompt = _count(p, lineno, columns[1], row[pi], minimum=1)
    output = _count(p, lineno, columns[2], row[oi], minimum=0)
    return t, prompt, output


def _count(path: Path, lineno: int, field: str, text: str, minimum: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(
            f"{path}:{lineno}: field {field}: {text!r} is not a whole number of tokens"
        ) from None
    if value < minimum:
        raise ConfigError(f"{path}:{lineno}: field {field}: {value} must be >= {minimum}")
    return value
