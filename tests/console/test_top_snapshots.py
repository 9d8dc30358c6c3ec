"""Screenshots of the console on the committed recording, at 80×24 and 160×48.

Regenerate after a deliberate change with
    .venv/bin/python -m pytest tests/console/test_top_snapshots.py --snapshot-update
and look at the SVGs under __snapshots__/ before committing them.
"""

from __future__ import annotations

import pytest

from fsd.console.top.app import TopApp
from fsd.console.top.data import fold


@pytest.fixture
def app(utc, recording) -> TopApp:
    # The recording folded up front: no worker, no wall clock, the same frame every run.
    return TopApp(None, None, state=fold(recording), label="replay top-recording.jsonl")


def test_console_80x24(snap_compare, app):
    assert snap_compare(app, terminal_size=(80, 24))


def test_console_160x48(snap_compare, app):
    assert snap_compare(app, terminal_size=(160, 48))


def test_job_detail_160x48(snap_compare, app):
    assert snap_compare(app, terminal_size=(160, 48), press=["down", "enter"])
