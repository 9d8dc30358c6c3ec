"""Shared fixtures of the console tests: the committed recording, a fixed time zone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fsd import protocol as P
from fsd.client import read_recording

RECORDING = Path(__file__).parent / "data" / "top-recording.jsonl"


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch):
    """Clock text in UTC, so rendered times do not depend on the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture(scope="session")
def recording() -> list[P.Snapshot | P.Event]:
    return list(read_recording(RECORDING))
