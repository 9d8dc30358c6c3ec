"""Telemetry consumers: a SUB client, sync and asyncio, and what they yield.

The daemon publishes two-frame messages `[topic, msgpack payload]` with topics
`snapshot` and `event`; the clients subscribe to either or both and yield decoded
`fsd.protocol.Snapshot` / `Event` structs, skipping frames they cannot decode.
Recordings of these frames (`fsctl record`) are `fsd.client.recording`'s.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import ClassVar, Generic, NamedTuple, TypeVar

import msgspec
import zmq
import zmq.asyncio

from fsd import protocol as P
from fsd.client.base import Closes
from fsd.client.keys import CurveKeys, connect

_TOPICS = {P.TOPIC_SNAPSHOT: "snapshot", P.TOPIC_EVENT: "event"}

Telemetry = P.Snapshot | P.Event
_Ctx = TypeVar("_Ctx", bound=zmq.Context)


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


class _Subscriber(Generic[_Ctx]):
    """A SUB socket on a daemon's telemetry (the sync or asyncio flavour of `_Ctx`)."""

    _context: ClassVar[type[zmq.Context]] = zmq.Context  # its default: the instance

    def __init__(
        self,
        endpoint: str = P.DEFAULT_TELEMETRY_ENDPOINT,
        *,
        snapshots: bool = True,
        events: bool = True,
        curve: CurveKeys | None = None,
        context: _Ctx | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.dropped = 0  # frames that did not decode
        ctx = context or self._context.instance()
        self._sock = _subscribe(ctx, endpoint, snapshots, events, curve)

    def close(self) -> None:
        self._sock.close(linger=0)


class TelemetryClient(_Subscriber[zmq.Context], Closes):
    """Subscribes to a daemon's telemetry; iterate it for Snapshot / Event messages.

    A SUB socket cannot tell a silent daemon from an absent one: `recv(timeout)`
    returns None when nothing arrived in time. One thread per client.
    """

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


class AsyncTelemetryClient(_Subscriber[zmq.asyncio.Context]):
    """The asyncio flavour of `TelemetryClient` (`await recv()`, `async for`)."""

    _context = zmq.asyncio.Context

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
