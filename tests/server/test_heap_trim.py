"""The daemon gives freed heap back once idle after work: once per idle spell, after
a moment of idleness, never more often than its interval, never while busy."""

from __future__ import annotations

import platform

import pytest

from fsd.server.heap_trim import IdleTrim, _glibc_trim


def test_trims_once_per_idle_spell_after_work_and_not_more_often_than_its_interval():
    now = [0.0]
    calls: list[int] = []
    trim = IdleTrim(settle=1.0, min_interval=30.0, clock=lambda: now[0])
    trim._trim = lambda pad: calls.append(pad) or 0

    def at(t: float, busy: bool) -> None:
        now[0] = t
        trim.tick(busy)

    at(0.0, False)
    at(5.0, False)
    assert calls == []  # idle from the start: nothing was freed
    at(6.0, True)
    at(7.0, False)
    at(7.5, False)
    assert calls == []  # not idle long enough yet
    at(8.0, False)
    assert calls == [0]
    at(9.0, False)
    at(20.0, True)
    at(21.0, False)
    at(25.0, False)
    assert calls == [0]  # worked again, but within the interval
    at(38.5, False)
    assert calls == [0, 0] and trim.trims == 2


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_trim_runs_here():
    trim = _glibc_trim()
    assert trim is not None and trim(0) in (0, 1)
