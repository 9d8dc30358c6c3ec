"""The gate's handshake checks (fsd.server.transport.zmtp): what passes, what is refused, and
that the peer's routing id never reaches libzmq, however the bytes are split."""

from __future__ import annotations

import random
import struct

import pytest

from fsd.server.transport import zmtp

GATE_ID = b"c\x00\x00\x00\x00\x00\x00\x00\x07"


def client_bytes(identity: bytes = b"\x00kB\x8bE", kind: bytes = b"DEALER") -> bytes:
    """What a libzmq DEALER sends: greeting, READY (with its Identity), then a message."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00")
    greeting += b"\x00" * 32
    ready = zmtp.ready([(b"Socket-Type", kind), (b"Identity", identity), (b"X-Tag", b"v")])
    return greeting + ready + zmtp.frame(b"hello")


def run(shake: zmtp.Handshake, data: bytes, cuts: list[int]) -> bytes:
    out, last = b"", 0
    for cut in [*cuts, len(data)]:
        out += shake.feed(data[last:cut])
        last = cut
    return out


def expected(identity_replaced_by: bytes = GATE_ID) -> bytes:
    greeting = client_bytes()[:64]
    ready = zmtp.ready(
        [(b"Socket-Type", b"DEALER"), (b"X-Tag", b"v"), (b"Identity", identity_replaced_by)]
    )
    return greeting + ready + zmtp.frame(b"hello")


@pytest.mark.parametrize("seed", range(40))
def test_any_split_gives_the_same_bytes_with_the_gate_id(seed):
    data = client_bytes()
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 12)))
    out = run(zmtp.Handshake(GATE_ID, curve=False), data, cuts)
    assert out == expected()
    props = zmtp.parse_ready(out[66 : 66 + out[65]])
    assert [v for n, v in props if n == b"Identity"] == [GATE_ID]


def test_byte_by_byte_and_nothing_before_the_signature_is_checked():
    data = client_bytes()
    shake = zmtp.Handshake(GATE_ID, curve=False)
    outs = [shake.feed(data[i : i + 1]) for i in range(len(data))]
    assert outs[:9] == [b""] * 9  # the signature is held until its 10th byte is seen
    assert b"".join(outs) == expected()


def test_two_identities_become_one_and_an_empty_one_is_replaced():
    twice = client_bytes()[:64] + zmtp.ready(
        [(b"Socket-Type", b"DEALER"), (b"Identity", b""), (b"Identity", b"\x00\x01\x02\x03\x04")]
    )
    out = zmtp.Handshake(GATE_ID, curve=False).feed(twice)
    props = zmtp.parse_ready(out[66:])
    assert [v for n, v in props if n == b"Identity"] == [GATE_ID]


@pytest.mark.parametrize(
    "data, why",
    [
        (b"\x01\x00hello", "ZMTP 1.0"),  # unversioned: identity as the first message
        (b"\xff" + b"\x00" * 8 + b"\x00", "ZMTP 1.0"),
        (b"\xff" + b"\x00" * 8 + b"\x7f\x01", "ZMTP 1.x"),
        (b"\xff" + b"\x00" * 8 + b"\x7f\x02", "ZMTP 2.x"),
        (client_bytes()[:12] + b"CURVE".ljust(20, b"\x00") + b"\x00" * 32, "mechanism"),
        (client_bytes(kind=b"ROUTER"), "socket type"),
        (client_bytes(kind=b"PUB"), "socket type"),
        (client_bytes()[:64] + zmtp.frame(b"not a command"), "not a command"),
        (client_bytes()[:64] + zmtp.frame(b"\x04PING", command=True), "not READY"),
        (client_bytes()[:64] + bytes([0x06]) + struct.pack(">Q", 1 << 40), "READY of"),
        (
            client_bytes()[:64]
            + zmtp.frame(b"\x05READY\x0bSocket-Type\x00\x00\x00\x09DE", command=True),
            "cut short",
        ),
    ],
)
def test_what_libzmq_would_take_a_chosen_id_from_is_refused(data, why):
    shake = zmtp.Handshake(GATE_ID, curve=False)
    with pytest.raises(zmtp.HandshakeRefused, match=why):
        for i in range(len(data)):  # byte by byte: refused before the id could pass
            out = shake.feed(data[i : i + 1])
            assert b"Identity" not in out


def test_under_curve_the_greeting_is_checked_and_the_rest_passes():
    greeting = client_bytes()[:12] + b"CURVE".ljust(20, b"\x00") + b"\x00" * 32
    shake = zmtp.Handshake(GATE_ID, curve=True)
    assert shake.feed(greeting + b"encrypted") == greeting + b"encrypted"
    assert shake.done and shake.feed(b"more") == b"more"
    with pytest.raises(zmtp.HandshakeRefused, match="mechanism"):
        zmtp.Handshake(GATE_ID, curve=True).feed(client_bytes())


@pytest.mark.parametrize("rid", [b"", b"\x00abc", b"x" * 256])
def test_the_gate_never_issues_an_id_libzmq_could_make_up(rid):
    with pytest.raises(ValueError):
        zmtp.Handshake(rid, curve=False)
