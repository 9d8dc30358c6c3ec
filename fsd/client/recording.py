"""Telemetry recordings: writing received frames to a file and reading them back.

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
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar

import msgspec

from fsd import protocol as P
from fsd.client.base import Closes
from fsd.client.telemetry import Frame, Telemetry
from fsd.errors import FsdError

RECORDING_FORMAT = "fsd-telemetry"
RECORDING_VERSION = 1


class RecordingError(FsdError, ValueError):
    """A telemetry recording that cannot be read (names the file and line) or written
    (a full disk: names the file and the system's reason); never on the wire."""

    code: ClassVar[str] = "bad-recording"


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


class RecordingWriter(Closes):
    """Appends telemetry frames to a JSON Lines recording (format in the module doc)."""

    def __init__(self, path: str | Path, endpoint: str | None = None) -> None:
        self.path = Path(path).expanduser()
        self.count = 0
        self._failed = False
        try:
            self._file: IO[bytes] = self.path.open("ab")
        except OSError as exc:
            raise self._error(exc) from None
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
        try:
            self._file.write(msgspec.json.encode(obj) + b"\n")
            self._file.flush()  # a killed recorder loses at most the line being written
        except OSError as exc:  # a full disk (ENOSPC), a quota, an I/O error
            self._failed = True
            raise self._error(exc) from None

    def _error(self, exc: OSError) -> RecordingError:
        done = f" after {self.count} frames" if self.count else ""
        why = exc.strerror or str(exc)
        return RecordingError(f"cannot write the recording {str(self.path)!r}{done}: {why}")

    def close(self) -> None:
        """Close the file; a write that failed was reported already (not again here)."""
        try:
            self._file.close()  # the file is closed even when its last flush fails
        except OSError as exc:
            if not self._failed:
                raise self._error(exc) from None


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
