"""Fixtures shared by the server tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.server.test_daemon_life import kill_quietly


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts; killed at the end."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        kill_quietly(p.pid)
        p.wait()
