"""Telemetry subscribers and recordings: topic filtering, decoding, write/read round trips."""

from __future__ import annotations

import asyncio
import time

import pytest

from fsd import protocol as P
from fsd.client import (
    AsyncTelemetryClient,
    Client,
    RecordingWriter,
    TelemetryClient,
    read_recording,
    read_records,
)
from fsd.client_telemetry import Frame, RecordingError
from tests.client.fake_daemon import free_port, snapshot


def test_snapshots_only(fake):
    with TelemetryClient(fake.telemetry_endpoint, events=False) as tc:
        got = [tc.recv(timeout=3) for _ in range(3)]
    assert all(isinstance(m, P.Snapshot) for m in got)
    assert [m.seq for m in got] == sorted(m.seq for m in got)


def test_events_only(fake):
    with (
        TelemetryClient(fake.telemetry_endpoint, snapshots=False) as tc,
        Client(fake.endpoint) as c,
    ):
        deadline = time.monotonic() + 5
        msg = None
        while msg is None:  # a SUB joins a moment after connecting: keep finishing jobs
            assert time.monotonic() < deadline
            c.complete("ab", max_tokens=2)
            msg = tc.recv(timeout=0.05)
    assert isinstance(msg, P.Event) and msg.kind == "finish"


def test_silence_is_none_not_an_error():
    with TelemetryClient(f"tcp://127.0.0.1:{free_port()}") as tc:
        assert tc.recv(timeout=0.1) is None
        assert tc.recv_frame(timeout=0) is None


def test_async_telemetry_client(fake):
    async def main() -> list[P.Snapshot | P.Event]:
        tc = AsyncTelemetryClient(fake.telemetry_endpoint, events=False)
        try:
            first = await tc.recv(timeout=3)
            rest = []
            async for msg in tc:
                rest.append(msg)
                if len(rest) == 2:
                    break
            return [first, *rest]
        finally:
            tc.close()

    got = asyncio.run(main())
    assert len(got) == 3 and all(isinstance(m, P.Snapshot) for m in got)


def _frames() -> list[Frame]:
    event = P.Event(time=time.time(), kind="preempt", job_id="job-1", detail={"level": 2})
    return [
        Frame(100.0, "snapshot", snapshot(2, seq=1)),
        Frame(100.1, "event", event),
        Frame(100.2, "snapshot", snapshot(1, seq=2)),
    ]


def test_recording_round_trip_and_append(tmp_path):
    path = tmp_path / "run.fsdrec"
    frames = _frames()
    with RecordingWriter(path, endpoint="tcp://127.0.0.1:5558") as w:
        for f in frames[:2]:
            w.write(f)
        assert w.count == 2
    with RecordingWriter(path) as w:  # a second session appends after its own header
        w.write(frames[2])
    assert list(read_records(path)) == frames
    assert list(read_recording(path)) == [f.message for f in frames]
    assert path.read_text().count('"format":"fsd-telemetry"') == 2


def test_recording_tolerates_a_truncated_last_line_only(tmp_path):
    path = tmp_path / "run.fsdrec"
    with RecordingWriter(path) as w:
        for f in _frames():
            w.write(f)
    with path.open("ab") as f:
        f.write(b'{"t": 1.0, "topic": "snap')  # the recorder died mid-line
    assert len(list(read_recording(path))) == 3

    broken = tmp_path / "broken.fsdrec"
    broken.write_text('{"t": 1.0, "topic": "weather", "payload": {}}\n')
    with pytest.raises(RecordingError, match="broken.fsdrec:1"):
        list(read_recording(broken))
    with pytest.raises(RecordingError, match="cannot open"):
        list(read_recording(tmp_path / "missing.fsdrec"))
