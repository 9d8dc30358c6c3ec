"""The wire under fsd's messages: the version, the limits, and frames to structs and back.

`fsd.protocol` defines the messages and re-exports every name here, so code reads
both through it (`import fsd.protocol as P`). This module knows no message type: it
encodes any msgspec Struct as one msgpack frame, and decodes a frame with the
decoder it is handed, turning every failure into a `ProtocolError` with a stable
code. Nothing is ever pickled.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import msgspec

from fsd.errors import FsdError

PROTOCOL_VERSION = 2
MAX_FRAME_BYTES = 8 * 1024 * 1024
MAX_SCENARIO_BYTES = 1024 * 1024  # an injected scenario's TOML text
MAX_TRACE_BYTES = 6 * 1024 * 1024  # the traces an injected scenario brings, together
TOPIC_SNAPSHOT = b"snapshot"
TOPIC_EVENT = b"event"
# where a daemon listens unless configured otherwise (ServerConfig's defaults agree)
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"
DEFAULT_TELEMETRY_ENDPOINT = "tcp://127.0.0.1:5558"

T = TypeVar("T")


class ProtocolError(FsdError, ValueError):
    """A frame that is not a valid message of this protocol version.

    Unlike the other `FsdError`s it has several codes, one per kind of bad frame
    (`CODES`); each instance carries its own `code`, which the daemon answers with.
    """

    code: ClassVar[str] = "malformed"
    CODES: ClassVar[tuple[str, ...]] = (
        "malformed",  # not msgpack, or not decodable at all
        "too-large",  # over MAX_FRAME_BYTES
        "bad-version",  # a message of another protocol version
        "invalid",  # a known message with a missing or wrong field
        "unknown-type",  # a message type this version does not have
        "unknown-topic",  # a telemetry frame under no known topic (client side)
    )

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code  # type: ignore[misc]  # this frame's kind, one of CODES


_encoder = msgspec.msgpack.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def check_version(msg: T) -> T:
    """`msg` itself, or ProtocolError "bad-version" if it is of another version."""
    v: Any = getattr(msg, "v", None)
    if v != PROTOCOL_VERSION:
        raise ProtocolError(
            "bad-version", f"protocol version {v} is not supported (this is {PROTOCOL_VERSION})"
        )
    return msg


def decode_strict(decoder: msgspec.msgpack.Decoder[T], frame: bytes) -> T:
    """Decode an untrusted frame or raise ProtocolError with a stable code.

    Any failure of the decoder is a ProtocolError, whatever msgspec raised (invalid
    UTF-8 in a string surfaces as UnicodeDecodeError, deep nesting as RecursionError).
    """
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(
            "too-large", f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"
        )
    try:
        msg = decoder.decode(frame)
    except msgspec.ValidationError as exc:
        code = "unknown-type" if "Invalid value" in str(exc) and "type" in str(exc) else "invalid"
        raise ProtocolError(code, f"invalid request: {_short(exc)}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError("malformed", f"malformed frame: {_short(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - no frame may escape as another exception
        raise ProtocolError(
            "malformed", f"malformed frame: {type(exc).__name__}: {_short(exc)}"
        ) from None
    return check_version(msg)


def _short(exc: BaseException, limit: int = 300) -> str:
    """An error's text, cut so that a reply never echoes a large frame back."""
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."
