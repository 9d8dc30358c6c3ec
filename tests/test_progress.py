"""fsd.progress: plain lines when the stream is no terminal, a live bar when it is."""

from __future__ import annotations

import io

import pytest

from fsd.progress import Progress


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_at_the_start_every_interval_and_at_the_end():
    out, clock = io.StringIO(), Clock()
    with Progress("simulating fcfs", 10, stream=out, interval=5.0, clock=clock) as bar:
        bar.update(2)  # too soon for a line
        clock.now += 6
        bar.update(4, info="t=12 s")
        clock.now += 1
        bar.update(5)  # too soon again
        clock.now += 5
        bar.update(10)
    assert out.getvalue().splitlines() == [
        "simulating fcfs: 0/10",
        "simulating fcfs: 4/10 t=12 s (6 s)",
        "simulating fcfs: 10/10 t=12 s (12 s)",
        "simulating fcfs: done 10/10 in 12.0 s",
    ]


def test_without_a_total_only_what_happens_and_the_time():
    out, clock = io.StringIO(), Clock()
    with Progress("starting the daemon", stream=out, interval=2.0, clock=clock) as bar:
        clock.now += 3
        bar.update(info="loading the model")
    assert out.getvalue().splitlines() == [
        "starting the daemon",
        "starting the daemon: loading the model (3 s)",
        "starting the daemon: done in 3.0 s",
    ]


def test_unannounced_work_writes_nothing_unless_it_lasts_an_interval():
    out, clock = io.StringIO(), Clock()
    with Progress("starting", stream=out, interval=5.0, clock=clock, announce=False) as bar:
        clock.now += 1
        bar.update(info="loading")
    assert out.getvalue() == ""
    with Progress("starting", stream=out, interval=5.0, clock=clock, announce=False) as bar:
        clock.now += 5
        bar.update(info="loading")
    assert out.getvalue().splitlines() == ["starting: loading (5 s)", "starting: done in 5.0 s"]


def test_an_error_ends_it_without_a_done_line():
    out = io.StringIO()
    with pytest.raises(RuntimeError), Progress("waiting for 3 jobs", 3, stream=out):
        raise RuntimeError("refused")
    assert out.getvalue() == "waiting for 3 jobs: 0/3\n"


def test_a_terminal_gets_the_live_bar_with_count_and_elapsed_time():
    out = io.StringIO()
    with Progress("waiting for 3 jobs", 3, stream=out, terminal=True) as bar:
        bar.update(2, info="1 finished")
    text = out.getvalue()
    assert "waiting for 3 jobs" in text and "2/3" in text and "0:00:0" in text
    assert "done" not in text  # no plain lines
