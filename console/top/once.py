"""`fsctl top --once`: one rich rendering of the daemon's state, then exit (as nvitop)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from fsd import protocol as P
from fsd.client import TelemetryClient, read_recording
from fsd.console.top import render
from fsd.console.top.data import TopState, TopView, fold, sort_rows
from fsd.console.top.source import silence_message
from fsd.errors import FsdError

ROWS = 40  # jobs printed (the caption says how many there are)


def live_view(endpoint: str, timeout: float, curve: object | None = None) -> TopView:
    """Telemetry until a snapshot with a job table (or `timeout`), folded into one view."""
    state = TopState()
    deadline = time.monotonic() + timeout
    with TelemetryClient(endpoint, curve=curve) as tc:  # type: ignore[arg-type]
        while (left := deadline - time.monotonic()) > 0:
            frame = tc.recv_frame(left)
            if frame is None:
                break
            state.apply(frame.message)
            if isinstance(frame.message, P.Snapshot) and frame.message.jobs is not None:
                break  # a complete picture: the table and everything else
    if state.snapshot is None:
        raise FsdError(silence_message(endpoint, timeout).replace("retrying...", "").rstrip())
    return state.view()


def replay_view(path: str | Path) -> TopView:
    """The state at the end of a recording."""
    view = fold(read_recording(path)).view()
    if view.snapshot is None:
        raise FsdError(f"recording {str(path)!r} holds no snapshot")
    return view


def print_once(view: TopView, label: str, console: Console, rows: int = ROWS, sort: str = "enst") -> None:  # fmt: skip
    ordered = sort_rows(view.rows, sort)
    console.print(render.once(view, ordered, label, rows, sort))
