"""The SLO window's statistics, preemptions and swaps per request included."""

from __future__ import annotations

import pytest

from fsd import protocol as P
from fsd.metrics import Finish, SLOWindow


def test_per_request_preemptions_and_swaps_over_the_window():
    w = SLOWindow(60.0, 0.1)
    assert w.stats(100.0)["swaps_per_request"] is None  # nothing finished yet
    w.add(Finish(10.0, 0.05, 0.2, 40, preemptions=9, swaps=9))  # leaves the window
    w.add(Finish(90.0, 0.05, 0.2, 40, preemptions=1, swaps=2))
    w.add(Finish(95.0, 0.07, 0.3, 20, preemptions=0, swaps=0))
    stats = w.stats(100.0)
    assert stats["finished"] == 2
    assert stats["preemptions_per_request"] == pytest.approx(0.5)
    assert stats["swaps_per_request"] == pytest.approx(1.0)
    info = P.SLOInfo(**stats)  # what telemetry carries
    assert info.swaps_per_request == pytest.approx(1.0)
