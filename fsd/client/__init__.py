"""The fsd client SDK: talk to a running daemon over ZeroMQ (sync and asyncio).

    from fsd.client import Client

    with Client() as c:                          # tcp://127.0.0.1:5557
        for chunk in c.generate("Hello", max_tokens=32):
            print(chunk.text, end="", flush=True)
        out = c.complete("Hi", max_tokens=8)     # Completion: text, timings, counts
        c.retune(policy="fcfs"); c.status(); c.jobs()
        c.preview(policy="fcfs")                 # what-if: current vs proposed, nothing applied

Owns: the client side of the wire. `core` is the socket-free core (routing replies
to calls and streams, deadlines, heartbeats, the liveness probe); `aio`
(`AsyncClient`) drives a socket with it, and `sync` (`Client`) runs an `AsyncClient`
on an event-loop thread of its own; `job` is a job's state as its handle reads it;
`telemetry` subscribes to snapshots and events, `recording` writes and reads them
back; `keys` holds CURVE keys and connects sockets; `base` has the defaults, the
`Completion` of a job and request building; `errors` the client's own errors. Import
names from `fsd.client`, not from its modules.

May import: the wire protocol (`fsd.protocol`, `fsd.protocol_preview`, `fsd.wire`:
messages, limits, the default endpoints), `fsd.errors`, `fsd.credentials`, and the
plain data it sends: `fsd.jobs` (SamplingParams), `fsd.workload.scenario` (a
scenario sent inline). Never
config, engine, sched, kv, server or torch: fsctl and client programs load the SDK
without the serving stack (tests/client/test_client_sdk.py holds it to that).
"""

from __future__ import annotations

from fsd.client.aio import AsyncClient, AsyncJobHandle
from fsd.client.base import Completion
from fsd.client.core import ClientCore
from fsd.client.errors import DaemonUnavailable, RequestError
from fsd.client.keys import CurveKeys
from fsd.client.recording import RecordingError, RecordingWriter, read_recording, read_records
from fsd.client.sync import Client, JobHandle
from fsd.client.telemetry import (
    AsyncTelemetryClient,
    Frame,
    TelemetryClient,
    generation_rate,
)
from fsd.wire import DEFAULT_ENDPOINT, DEFAULT_TELEMETRY_ENDPOINT

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_TELEMETRY_ENDPOINT",
    "AsyncClient",
    "AsyncJobHandle",
    "AsyncTelemetryClient",
    "Client",
    "ClientCore",
    "Completion",
    "CurveKeys",
    "DaemonUnavailable",
    "Frame",
    "JobHandle",
    "RecordingError",
    "RecordingWriter",
    "RequestError",
    "TelemetryClient",
    "generation_rate",
    "read_recording",
    "read_records",
]
