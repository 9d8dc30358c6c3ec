"""Fixtures of the client tests: a fake daemon on free loopback ports."""

from __future__ import annotations

import pytest

from tests.client.fake_daemon import FakeDaemon


@pytest.fixture
def fake():
    daemon = FakeDaemon(telemetry=True).start()
    yield daemon
    daemon.stop()
