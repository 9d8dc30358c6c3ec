"""Fixtures of the client tests: a real daemon, and the fake one.

`daemon`: a real fsd daemon shared by the SDK and telemetry modules (test_fsctl.py
has its own, which its last test shuts down): the happy paths run against it. Its
client_timeout is long, so a job that goes away early was aborted, not reaped.
`fake`: the fake daemon of `fake_daemon`, only for timing faults (late answers,
none, a daemon that dies or is not there yet).
"""

from __future__ import annotations

import pytest

from tests.client.fake_daemon import FakeDaemon
from tests.server.daemon_proc import start_daemon

CONFIG = """
[cache]
num_gpu_blocks = 512
num_host_blocks = 512
[sched]
max_batch_size = 8
[server]
telemetry_hz = 20
client_timeout = 30.0
"""


@pytest.fixture(scope="package")
def daemon(tmp_path_factory: pytest.TempPathFactory):
    d = start_daemon(tmp_path_factory.mktemp("client"), CONFIG)
    yield d
    assert d.stop() == 0


@pytest.fixture
def fake():
    daemon = FakeDaemon(telemetry=True).start()
    yield daemon
    daemon.stop()
