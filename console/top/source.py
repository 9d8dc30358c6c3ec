"""Where the console's telemetry comes from, and the feed loop that folds it.

`LiveSource` subscribes to a daemon (ZeroMQ SUB reconnects by itself, so an absent
daemon only means silence); `ReplaySource` plays a `fsctl record` file at its
recorded pace. `TelemetryFeed.run` is the telemetry worker's body: it folds every frame into
the `TopState` and hands the UI at most `hz` views a second, so a UI slower than
the telemetry renders only the latest state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from fsd.client import Frame, RecordingError, TelemetryClient, read_records
from fsd.console.top.data import TopState, TopView


class Source(Protocol):
    """A stream of telemetry frames."""

    label: str
    done: bool  # nothing more will come (the end of a recording)

    def recv(self, timeout: float) -> Frame | None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...


class LiveSource:
    """A running daemon's telemetry (snapshots and events)."""

    def __init__(self, endpoint: str, curve: object | None = None) -> None:
        self.label = endpoint
        self.done = False
        self._client = TelemetryClient(endpoint, curve=curve)  # type: ignore[arg-type]

    def recv(self, timeout: float) -> Frame | None:
        return self._client.recv_frame(timeout)

    def pause(self) -> None:
        """Live telemetry keeps flowing while the display is paused."""

    def resume(self) -> None:
        pass

    def close(self) -> None:
        self._client.close()


class ReplaySource:
    """A recording played back at `speed` × its recorded pace (0: as fast as possible).

    The first frame is read at once, so a missing, unreadable or malformed file is a
    RecordingError (an FsdError) here rather than in the telemetry worker; a bad line
    further on raises from `recv`, which `TelemetryFeed.run` lets through to the console.
    """

    def __init__(self, path: str | Path, speed: float = 1.0) -> None:
        self.label = f"replay {Path(path).name}"
        self.done = False
        self.speed = speed
        self._frames: Iterator[Frame] = read_records(path)
        self._next: Frame | None = next(self._frames, None)
        if self._next is None:
            raise RecordingError(f"recording {str(path)!r} holds no telemetry")
        self._t0: float | None = None  # recorded time of the first frame
        self._start = time.monotonic()
        self._paused_at: float | None = None

    def recv(self, timeout: float) -> Frame | None:
        if self._paused_at is not None:
            time.sleep(timeout)
            return None
        if self._next is None:
            self._next = next(self._frames, None)
            if self._next is None:
                self.done = True
                return None
        frame = self._next
        if self._t0 is None:
            self._t0 = frame.t
        if self.speed > 0:
            wait = self._start + (frame.t - self._t0) / self.speed - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, timeout))
                if wait > timeout:
                    return None
        self._next = None
        return frame

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = time.monotonic()

    def resume(self) -> None:
        if self._paused_at is not None:  # the pause does not count as recorded time
            self._start += time.monotonic() - self._paused_at
            self._paused_at = None

    def close(self) -> None:
        pass


def silence_message(label: str, seconds: float) -> str:
    return (
        f"no telemetry from {label} for {seconds:.0f}s: is the daemon running "
        "(fsd start) with telemetry_hz > 0? retrying..."
    )


class TelemetryFeed:
    """Folds a source's frames into a state; reports views and connection status."""

    def __init__(
        self,
        source: Source,
        state: TopState,
        on_view: Callable[[TopView], None],
        on_status: Callable[[str, bool], None],
        hz: float = 4.0,
        silence: float = 3.0,
    ) -> None:
        self.source = source
        self.state = state
        self.on_view = on_view
        self.on_status = on_status
        self.period = 1.0 / hz
        self.silence = silence
        self.paused = False

    def run(self, cancelled: Callable[[], bool]) -> None:
        """Until `cancelled()` or the source ends; frames are folded as they come."""
        src = self.source
        last_frame = last_post = time.monotonic()
        dirty = warned = False
        self.on_status(f"waiting for telemetry from {src.label}", False)
        while not cancelled():
            # Live telemetry is still folded while paused (nothing is lost); a replay stops.
            if self.paused:
                src.pause()
            else:
                src.resume()
            frame = src.recv(min(0.1, self.period))
            now = time.monotonic()
            if frame is not None:
                self.state.apply(frame.message)
                dirty, last_frame = True, now
                if warned or self.state.frames == 1:
                    self.on_status("", True)
                    warned = False
            elif src.done:
                break
            elif self.paused:
                last_frame = now
            elif not warned and now - last_frame >= self.silence:
                self.on_status(silence_message(src.label, now - last_frame), False)
                warned = True
            if dirty and not self.paused and now - last_post >= self.period:
                self.on_view(self.state.view())
                dirty, last_post = False, now
        if dirty or src.done:
            self.on_view(self.state.view())
        if src.done:
            self.on_status(f"replay finished ({self.state.frames} frames)", True)
