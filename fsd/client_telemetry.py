"""Telemetry consumers: a SUB client (sync and asyncio) and telemetry recordings.

The daemon publishes two-frame messages `[topic, msgpack payload]` with topics
`snapshot` and `event`; the clients subscribe to either or both and yield decoded
`fsd.protocol.Snapshot` / `Event` structs, skipping frames they cannot decode.

Recording format (`fsctl record`, read back by `read_recording`): UTF-8 JSON Lines.
The first line of each recording session is a header,
    {"format": "fsd-telemetry", "version": 1, "protocol": 2, "endpoint": ..., "started": T}
and every other line one received frame,
    {"t": 1700000000.125, "topic": "snapshot" | "event", "payload": {...}}
where `t` is the wall-clock receive time and `payload` the message as JSON (the
fields of `Snapshot` / `Event`). Appending to an existing file adds a new header;
a truncated last line (a recorder killed mid-write) is ignored.

`protocol` is the telemetry's protocol version. Sessions of protocol 1 counted levels
from 0; they are read as protocol 2 (levels + 1: 1 = Q1), so old recordings replay
with the same level names. A newer protocol than this fsd's is refused.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

import msgspec
import zmq
import zmq.asyncio

from fsd import protocol as P
from fsd.client_base import DEFAULT_TELEMETRY_ENDPOINT, CurveKeys, connect
from fsd.errors import FsdError

RECORDING_FORMAT = "fsd-telemetry"
RECORDING_VERSION = 1
_TOPICS = {P.TOPIC_SNAPSHOT: "snapshot", P.TOPIC_EVENT: "event"}

Telemetry = P.Snapshot | P.Event


class RecordingError(FsdError, ValueError):
    """A telemetry recording that cannot be read (names the file and line)."""


class Frame(NamedTuple):
    """One telemetry message as received: wall-clock time, topic name, message."""

    t: float
    topic: str
    message: Telemetry


RATE_WINDOW = 2.0  # seconds of iterations `generation_rate` averages over


def generation_rate(s: P.Snapshot, window: float = RATE_WINDOW) -> float:
    """Tokens the engine generated per second in the last `window` seconds of `s`.

    Every job of an iteration's batch gets one token (a prefill its first, a decode its
    next), so an iteration makes `batch_size` tokens. Counted over the iterations that
    ended between `start` = max(s.time - window, the first listed one's start) and the
    snapshot's time: streaming jobs count as they stream (`SLOInfo.tokens_per_s` counts
    finished jobs only), and an idle engine falls to 0 once `window` has passed.
    """
    its = s.iterations
    if not its:
        return 0.0
    start = max(s.time - window, its[0].start)
    span = s.time - start
    if span <= 0:
        return 0.0
    return sum(it.batch_size for it in its if it.start + it.duration > start) / span


def decode_frame(topic: bytes, payload: bytes) -> Telemetry:
    """A telemetry payload as its struct (ProtocolError / msgspec errors if invalid)."""
    if topic == P.TOPIC_SNAPSHOT:
        return P.decode_snapshot(payload)
    if topic == P.TOPIC_EVENT:
        return P.decode_event(payload)
    raise P.ProtocolError("unknown-topic", f"unknown telemetry topic {topic!r}")


def _subscribe(
    ctx: zmq.Context, endpoint: str, snapshots: bool, events: bool, curve: CurveKeys | None
) -> zmq.Socket:
    if not (snapshots or events):
        raise ValueError("subscribe to snapshots, events or both")
    sock = connect(ctx, zmq.SUB, endpoint, curve.resolve() if curve else None)
    sock.setsockopt(zmq.RCVHWM, 10_000)
    for topic, wanted in ((P.TOPIC_SNAPSHOT, snapshots), (P.TOPIC_EVENT, events)):
        if wanted:
            sock.setsockopt(zmq.SUBSCRIBE, topic)
    return sock


def _decode(parts: list[bytes]) -> Frame | None:
    if len(parts) != 2 or parts[0] not in _TOPICS:  # prefix matches like b"events"
        return None
    try:
        return Frame(time.time(), _TOPICS[parts[0]], decode_frame(parts[0], parts[1]))
    except (P.ProtocolError, msgspec.DecodeError, msgspec.ValidationError):
        return None


class TelemetryClient:
    """Subscribes to a daemon's telemetry; iterate it for Snapshot / Event messages.

    A SUB socket cannot tell a silent daemon from an absent one: `recv(timeout)`
    returns None when nothing arrived in time. One thread per client.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_TELEMETRY_ENDPOINT,
        *,
        snapshots: bool = True,
        events: bool = True,
        curve: CurveKeys | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.dropped = 0  # frames that did not decode
        self._sock = _subscribe(
            context or zmq.Context.instance(), endpoint, snapshots, events, curve
        )

    def recv_frame(self, timeout: float | None = None) -> Frame | None:
        """The next message with its receive time, or None after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._sock.poll(None if left is None else left * 1000):
                return None
            frame = _decode(self._sock.recv_multipart())
            if frame is not None:
                return frame
            self.dropped += 1

    def recv(self, timeout: float | None = None) -> Telemetry | None:
        frame = self.recv_frame(timeout)
        return None if frame is None else frame.message

    def __iter__(self) -> Iterator[Telemetry]:
        while True:
            frame = self.recv_frame()
            if frame is not None:
                yield frame.message

    def close(self) -> None:
        self._sock.close(linger=0)

    def __enter__(self) -> TelemetryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTelemetryClient:
    """The asyncio flavour of `TelemetryClient` (`await recv()`, `async for`)."""

    def __init__(
        self,
        endpoint: str = DEFAULT_TELEMETRY_ENDPOINT,
        *,
        snapshots: bool = True,
        events: bool = True,
        curve: CurveKeys | None = None,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.dropped = 0
        ctx = context or zmq.asyncio.Context.instance()
        self._sock = _subscribe(ctx, endpoint, snapshots, events, curve)

    async def recv_frame(self, timeout: float | None = None) -> Frame | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not await self._sock.poll(None if left is None else left * 1000):
                return None
            frame = _decode(await self._sock.recv_multipart())
            if frame is not None:
                return frame
            self.dropped += 1

    async def recv(self, timeout: float | None = None) -> Telemetry | None:
        frame = await self.recv_frame(timeout)
        return None if frame is None else frame.message

    async def __aiter__(self) -> AsyncIterator[Telemetry]:
        while True:
            frame = await self.recv_frame()
            if frame is not None:
                yield frame.message

    def close(self) -> None:
        self._sock.close(linger=0)


# ---- recordings --------------------------------------------------------------------


class _Line(msgspec.Struct):
    format: str | None = None
    version: int | None = None
    protocol: int | None = None
    t: float | None = None
    topic: str | None = None
    payload: msgspec.Raw = msgspec.Raw()


_line_decoder = msgspec.json.Decoder(_Line)
_json_decoders = {
    "snapshot": msgspec.json.Decoder(P.Snapshot),
    "event": msgspec.json.Decoder(P.Event),
}


class RecordingWriter:
    """Appends telemetry frames to a JSON Lines recording (format in the module doc)."""

    def __init__(self, path: str | Path, endpoint: str | None = None) -> None:
        self.path = Path(path).expanduser()
        self.count = 0
        self._file: IO[bytes] = self.path.open("ab")
        header: dict[str, Any] = {
            "format": RECORDING_FORMAT,
            "version": RECORDING_VERSION,
            "protocol": P.PROTOCOL_VERSION,
            "endpoint": endpoint,
            "started": time.time(),
        }
        self._write_line(header)

    def write(self, frame: Frame) -> None:
        self._write_line({"t": frame.t, "topic": frame.topic, "payload": frame.message})
        self.count += 1

    def _write_line(self, obj: dict[str, Any]) -> None:
        self._file.write(msgspec.json.encode(obj) + b"\n")
        self._file.flush()  # a killed recorder loses at most the line being written

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | Path) -> Iterator[Frame]:
    """Every frame of a recording with its receive time (for timed replay)."""
    p = Path(path).expanduser()
    try:
        f = p.open("rb")
    except OSError as exc:
        raise RecordingError(f"cannot open recording {str(p)!r}: {exc.strerror}") from None
    with f:
        protocol = P.PROTOCOL_VERSION  # frames before any header: this version's
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                line = _line_decoder.decode(raw)
                if line.format is not None:
                    protocol = _header_protocol(line)
                    continue
                frame = _frame(line, protocol)
            except (msgspec.DecodeError, RecordingError, UnicodeDecodeError) as exc:
                if not raw.endswith(b"\n"):
                    return  # the truncated last line of a killed recorder
                raise RecordingError(f"{p}:{lineno}: not a telemetry record: {exc}") from None
            yield frame


def _header_protocol(line: _Line) -> int:
    """The protocol version of the session a header line starts (RecordingError if unknown)."""
    if line.format != RECORDING_FORMAT or (line.version or 0) > RECORDING_VERSION:
        raise RecordingError(f"unsupported recording format {line.format} v{line.version}")
    protocol = P.PROTOCOL_VERSION if line.protocol is None else line.protocol
    if not 1 <= protocol <= P.PROTOCOL_VERSION:
        raise RecordingError(
            f"recorded with telemetry protocol v{protocol}; this fsd reads v1 to "
            f"v{P.PROTOCOL_VERSION}"
        )
    return protocol


def _frame(line: _Line, protocol: int) -> Frame:
    decoder = _json_decoders.get(line.topic or "")
    if decoder is None or not len(line.payload) or line.t is None:
        raise RecordingError(f"unknown topic {line.topic!r} or missing t/payload")
    msg = decoder.decode(line.payload)
    return Frame(line.t, line.topic or "", _from_v1(msg) if protocol == 1 else msg)


def _from_v1(msg: Telemetry) -> Telemetry:
    """A protocol-1 message as protocol 2 says it: levels 1-based (Q1 = 1)."""
    msg.v = P.PROTOCOL_VERSION
    if isinstance(msg, P.Snapshot):
        for lv in msg.levels:
            lv.index += 1
        for job in msg.jobs or ():
            job.level += 1
    elif isinstance(msg.detail.get("level"), int):
        msg.detail = {**msg.detail, "level": msg.detail["level"] + 1}
    return msg


def read_recording(path: str | Path) -> Iterator[Telemetry]:
    """The Snapshot / Event messages of a recording, in the order they arrived."""
    for frame in read_records(path):
        yield frame.message
