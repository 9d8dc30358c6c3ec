"""Regenerate tests/console/data/top-recording.jsonl from a real daemon.

    .venv/bin/python -m tests.console.make_recording

A small cache (48 device blocks) and two injected bursts make jobs queue at
several levels, get preempted and swap; telemetry is recorded for a few seconds
through the same `RecordingWriter` that `fsctl record` uses.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from fsd.client import RecordingWriter, TelemetryClient
from tests.server.daemon_proc import pool_config, start_daemon

OUT = Path(__file__).parent / "data" / "top-recording.jsonl"
CONFIG = pool_config(48, 6, 10)


def record(out: Path = OUT, seconds: float = 2.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        daemon = start_daemon(Path(tmp), CONFIG)
        try:
            out.unlink(missing_ok=True)
            with TelemetryClient(daemon.telemetry) as tc, RecordingWriter(out, daemon.telemetry) as w:  # fmt: skip
                time.sleep(0.3)  # the SUB socket joins before anything happens
                with daemon.client() as c:
                    c.inject(burst=(4, 16, 12), tag="short")  # ends soon: SLO figures
                    c.inject(burst=(10, 48, 400))
                    end = time.monotonic() + seconds
                    burst_at = time.monotonic() + 0.6
                    while time.monotonic() < end:
                        if burst_at and time.monotonic() >= burst_at:
                            c.inject(burst=(6, 200, 200), tag="long")
                            burst_at = 0.0
                        frame = tc.recv_frame(0.1)
                        if frame is not None:
                            w.write(frame)
        finally:
            daemon.stop()
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    record()
