"""Telemetry subscribers against a real daemon; recordings: write/read round trips."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from fsd import protocol as P
from fsd.client import (
    AsyncTelemetryClient,
    Frame,
    RecordingError,
    RecordingWriter,
    TelemetryClient,
    generation_rate,
    read_recording,
    read_records,
)
from tests.client.fake_daemon import free_port, snapshot


def test_snapshots_only(daemon):
    with TelemetryClient(daemon.telemetry, events=False) as tc:
        got = [tc.recv(timeout=5) for _ in range(3)]
    assert all(isinstance(m, P.Snapshot) for m in got)
    assert [m.seq for m in got] == sorted(m.seq for m in got)


def test_events_only(daemon):
    with TelemetryClient(daemon.telemetry, snapshots=False) as tc, daemon.client() as c:
        deadline = time.monotonic() + 10
        msg = None
        while msg is None:  # a SUB joins a moment after connecting: keep running jobs
            assert time.monotonic() < deadline
            c.complete([1, 2], max_tokens=2, ignore_eos=True)
            msg = tc.recv(timeout=0.05)
    assert isinstance(msg, P.Event) and msg.job_id is not None


def test_silence_is_none_not_an_error():
    with TelemetryClient(f"tcp://127.0.0.1:{free_port()}") as tc:
        assert tc.recv(timeout=0.1) is None
        assert tc.recv_frame(timeout=0) is None


def test_async_telemetry_client(daemon):
    async def main() -> list[P.Snapshot | P.Event]:
        tc = AsyncTelemetryClient(daemon.telemetry, events=False)
        try:
            first = await tc.recv(timeout=5)
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


def test_a_protocol_1_recording_reads_with_1_based_levels(tmp_path):
    # v1 counted levels from 0 (Q1 was 0); a session recorded then replays as v2 says it
    v1 = tmp_path / "v1.fsdrec"
    snap = snapshot(1, seq=1)
    snap.levels = [P.LevelInfo(index=0, quantum=0.01, job_ids=["a"])]
    snap.jobs = [P.JobInfo(job_id="a", state="running", level=0, kv="device", blocks=1,
                           host_blocks=0, enst=None, prompt_tokens=3, output_tokens=1,
                           waited=0.0, attained=0.0, arrival=1.0)]  # fmt: skip
    snap.v = 1
    event = P.Event(time=1.0, kind="demote", job_id="a", detail={"level": 1})
    lines = [
        {"format": "fsd-telemetry", "version": 1, "protocol": 1, "endpoint": None, "started": 0},
        {"t": 1.0, "topic": "snapshot", "payload": snap},
        {"t": 1.1, "topic": "event", "payload": event},
    ]
    v1.write_bytes(b"".join(msgspec.json.encode(line) + b"\n" for line in lines))
    with RecordingWriter(v1) as w:  # a v2 session appended: read as it is
        w.write(Frame(2.0, "event", P.Event(time=2.0, kind="demote", job_id="a", detail={"level": 3})))  # fmt: skip
    got_snap, got_event, later = read_recording(v1)
    assert got_snap.v == P.PROTOCOL_VERSION
    assert [lv.index for lv in got_snap.levels] == [1] and got_snap.jobs[0].level == 1
    assert got_event.detail == {"level": 2} and later.detail == {"level": 3}


def test_a_recording_of_a_newer_protocol_is_refused(tmp_path):
    path = tmp_path / "v9.fsdrec"
    path.write_text('{"format": "fsd-telemetry", "version": 1, "protocol": 9}\n')
    with pytest.raises(
        RecordingError, match="v9.fsdrec:1: .*protocol v9; this fsd reads v1 to v2"
    ) as err:
        list(read_recording(path))
    assert err.value.code == "bad-recording"


def _iteration(start: float, batch: int, duration: float = 0.01) -> P.IterationInfo:
    return P.IterationInfo(start=start, duration=duration, batch_size=batch,
                           prefill_tokens=0, decode_tokens=batch)  # fmt: skip


def test_generation_rate_counts_every_batched_job_not_only_finished_ones():
    snap = snapshot(32)
    snap.time = 101.0
    # 32 jobs streaming, none finished: 100 iterations of 10 ms in the last second
    snap.iterations = [_iteration(100.0 + i * 0.01, 32) for i in range(100)]
    snap.slo.tokens_per_s, snap.slo.finished = 0.0, 0
    assert generation_rate(snap) == pytest.approx(3200.0)
    # only the last `window` seconds count; an idle engine falls to 0 after it
    assert generation_rate(snap, window=0.5) == pytest.approx(50 * 32 / 0.5)
    snap.time = 104.0
    assert generation_rate(snap) == 0.0
    snap.iterations = []
    assert generation_rate(snap) == 0.0
