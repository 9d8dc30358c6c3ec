"""Progress of a long operation: a live bar on a terminal, plain lines in a log.

`with Progress(label, total) as bar:` opens one that its caller updates (`bar.update`) as the work
advances, as often as it likes. When the stream (stderr by default) is a terminal
it is a rich spinner with the count (and a bar when the total is known), what is
happening now, and the elapsed time, redrawn on rich's own thread, so the clock
runs even while the caller waits. Anywhere else (a log file, a pipe, CI) it writes
plain lines: the label when the work starts, `label: 3/10 info (12 s)` at most every
`interval` seconds while it goes on, and `label: done 10/10 in 41.2 s` at its end
(nothing when it ends by an exception: the error says why). With `announce=False`
a short operation writes nothing at all: the lines begin once it has lasted
`interval` (a command whose output is checked line by line when it fails fast).

Nothing here knows what the work is: callers that must not import rich (the
simulator's loop) take a plain `(done, total)` callback, and `Progress.update` is one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

PLAIN_INTERVAL = 5.0  # seconds between two plain lines of one operation
ProgressFn = Callable[[int, int], None]  # (done, total): what a loop reports


class Progress:
    """One operation's progress; `update` it, it draws or writes what is due."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        stream: IO[str] | None = None,
        interval: float = PLAIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        terminal: bool | None = None,
        transient: bool = False,
        announce: bool = True,
    ) -> None:
        """`terminal`: draw the live bar (default: whether `stream` is a tty);
        `transient`: the bar disappears at the end (a wait whose result is printed);
        `announce`: write the label at the start (else plain lines wait `interval`)."""
        self.label = label
        self.total = total
        self.done = 0
        self.info = ""
        self._stream = stream if stream is not None else sys.stderr
        self._interval = interval
        self._clock = clock
        isatty = getattr(self._stream, "isatty", None)
        self._terminal = bool(isatty and isatty()) if terminal is None else terminal
        self._transient = transient
        self._announce = announce
        self._wrote = False  # a plain line was written (so the end gets one too)
        self._live: Any = None  # the rich Progress on a terminal
        self._task: Any = None
        self._started = self._next_line = 0.0

    @property
    def elapsed(self) -> float:
        """Seconds since the operation started."""
        return self._clock() - self._started

    def __enter__(self) -> Progress:
        self._started = self._clock()
        self._next_line = self._started + self._interval
        if self._terminal:
            self._live = _live_bar(self._stream, self.total is not None, self._transient)
            self._task = self._live.add_task(self.label, total=self.total, info="")
            self._live.start()
        elif self._announce:
            self._write(self.label + (f": 0/{self.total}" if self.total is not None else ""))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if self._live is not None:
            self._live.stop()
        elif exc_type is None and self._wrote:
            counts = f" {self._counts()}" if self._counts() else ""
            self._write(f"{self.label}: done{counts} in {self.elapsed:.1f} s")

    def update(
        self, done: int | None = None, total: int | None = None, *, info: str | None = None
    ) -> None:
        """The work so far: `done` items of `total` (either may stay as it was) and a
        few words on what happens now. Also a `ProgressFn`: `update(done, total)`."""
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        if info is not None:
            self.info = info
        if self._live is not None:
            self._live.update(self._task, completed=self.done, total=self.total, info=self.info)
            return
        now = self._clock()
        if now >= self._next_line:
            self._next_line = now + self._interval
            said = " ".join(p for p in (self._counts(), self.info) if p)
            head = f"{self.label}: {said}" if said else self.label
            self._write(f"{head} ({now - self._started:.0f} s)")

    def _counts(self) -> str:
        if self.total is not None:
            return f"{self.done}/{self.total}"
        return str(self.done) if self.done else ""

    def _write(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()
        self._wrote = True


def _live_bar(stream: IO[str], counted: bool, transient: bool) -> Any:
    """The terminal's bar: spinner, label, [bar, n/total,] what happens now, elapsed."""
    import rich.progress as rp
    from rich.console import Console

    columns: list[Any] = [rp.SpinnerColumn(), rp.TextColumn("{task.description}", markup=False)]
    if counted:
        columns += [rp.BarColumn(), rp.MofNCompleteColumn()]
    columns += [rp.TextColumn("{task.fields[info]}", markup=False), rp.TimeElapsedColumn()]
    return rp.Progress(*columns, console=Console(file=stream), transient=transient)
