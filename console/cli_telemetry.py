"""`fsctl` commands over the telemetry stream: watch, record and the `top` console.

Plain functions; `console/cli.py` registers them on the `fsctl` app.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated

import typer

from fsd.cli_errors import fail, friendly
from fsd.console import cli_format as fmt
from fsd.console.cli_target import target_of

_EVENTS = typer.Option("--events", help="Only events (default: events and snapshots).")
_SNAPSHOTS = typer.Option("--snapshots", help="Only snapshots (default: both).")


def watch(
    ctx: typer.Context,
    events: Annotated[bool, _EVENTS] = False,
    snapshots: Annotated[bool, _SNAPSHOTS] = False,
    count: Annotated[int | None, typer.Option(help="Stop after this many lines.")] = None,
) -> None:
    """Print the daemon's telemetry, one line per snapshot or event (Ctrl-C stops)."""
    target = target_of(ctx)
    want_snap, want_events = (snapshots, events) if snapshots or events else (True, True)
    with friendly(), target.telemetry(want_snap, want_events) as tc:
        shown = 0
        with contextlib.suppress(KeyboardInterrupt):
            while count is None or shown < count:
                # Snapshots come several times a second: none at first means no daemon.
                first = shown == 0 and want_snap
                msg = tc.recv(timeout=target.timeout if first else None)
                if msg is None:
                    target.no_telemetry()
                typer.echo(fmt.telemetry_line(msg))
                shown += 1


def record(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="Recording to append to (JSON Lines).")],
    duration: Annotated[
        float | None,
        typer.Option(help="Seconds to record (default: until Ctrl-C)."),
    ] = None,
    events: Annotated[bool, _EVENTS] = False,
    snapshots: Annotated[bool, _SNAPSHOTS] = False,
) -> None:
    """Record telemetry to FILE for replay (`fsd.client.read_recording`, `fsctl top --replay`)."""
    from fsd.client import RecordingWriter

    target = target_of(ctx)
    want_snap, want_events = (snapshots, events) if snapshots or events else (True, True)
    counts = {"snapshot": 0, "event": 0}
    writer = None
    start = time.monotonic()
    end = None if duration is None else start + duration
    with friendly(), target.telemetry(want_snap, want_events) as tc:
        try:
            while end is None or time.monotonic() < end:
                waits = [] if end is None else [end - time.monotonic()]
                if writer is None and want_snap:
                    waits.append(start + target.timeout - time.monotonic())
                frame = tc.recv_frame(max(0.0, min(waits)) if waits else None)
                if frame is None:
                    if writer is None and want_snap and time.monotonic() - start >= target.timeout:
                        target.no_telemetry()
                    continue
                if writer is None:  # created on the first frame: no empty files
                    writer = RecordingWriter(file, endpoint=target.telemetry_endpoint)
                writer.write(frame)
                counts[frame.topic] += 1
        except KeyboardInterrupt:
            pass
        finally:
            if writer is not None:
                writer.close()
    total = counts["snapshot"] + counts["event"]
    typer.echo(
        f"recorded {total} frames ({counts['snapshot']} snapshots, {counts['event']} events) "
        f"in {time.monotonic() - start:.1f} s to {file}",
        err=True,
    )


def top(
    ctx: typer.Context,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
    replay: Annotated[
        Path | None,
        typer.Option(help="Play a recording from `fsctl record` instead of a live daemon."),
    ] = None,
    hz: Annotated[float, typer.Option(help="Screen refreshes per second, at most.")] = 4.0,
    speed: Annotated[
        float, typer.Option(help="Replay pace (2 = twice as fast, 0 = at once).")
    ] = 1.0,  # fmt: skip
) -> None:
    """The live operator console: queues, jobs, KV, SLO, and levers to change them."""
    if hz <= 0:
        fail(f"--hz must be > 0, got {hz}")
    if speed < 0:
        fail(f"--speed must be >= 0, got {speed}")
    target = target_of(ctx)
    from fsd.console.top import run

    with friendly():
        curve, token = target.curve(), None if replay is not None else target.token()
        if replay is None:
            target.check_daemon()
        run(
            target.endpoint,
            target.telemetry_endpoint,
            timeout=target.timeout,
            curve=curve,
            token=token,
            once=once,
            replay=replay,
            hz=hz,
            speed=speed,
        )
