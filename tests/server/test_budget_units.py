"""The gate's byte budgets, piece by piece: the frame cutter, the stand-in and its
req_id, the inbound ledger (reserve, settling)."""

from __future__ import annotations

import random

from fsd import protocol as P
from fsd.server.transport import frames as F
from fsd.server.transport import zmtp
from fsd.server.transport.ledger import FRAME_COST, InboundLedger, cost
from fsd.server.transport.msgpack_peek import prefix_field, prefix_req_id


def _cut(stream: bytes, cuts: list[int]) -> list[F.Head | bytes]:
    cutter, out, pos = F.FrameCutter(), [], 0
    for end in [*cuts, len(stream)]:
        out += cutter.feed(stream[pos:end])
        pos = end
    return out


def test_the_cutter_finds_each_frame_however_the_bytes_are_cut():
    bodies = [b"", b"a", b"x" * 7, b"y" * 8, b"z" * 255, b"w" * 256, b"v" * 70_000]
    stream = b"".join(zmtp.frame(b, more=bool(i % 2)) for i, b in enumerate(bodies))
    stream += zmtp.frame(b"\x04PING", command=True)
    rng = random.Random(3)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(stream)), 12))
        pieces = _cut(stream, cuts)
        heads = [p for p in pieces if isinstance(p, F.Head)]
        assert [h.size for h in heads] == [*map(len, bodies), 5]
        assert [h.flags & zmtp.FLAG_MORE for h in heads[:-1]] == [i % 2 for i in range(len(bodies))]
        assert heads[-1].command and F.payload_size(heads[-1], curve=False) is None
        # every byte comes out once, in order: headers, peeks and bodies
        assert b"".join(p.header + p.peek if isinstance(p, F.Head) else p for p in pieces) == stream


def test_the_cutter_never_holds_a_body():
    cutter = F.FrameCutter()
    assert cutter.feed(b"\x02" + (1 << 40).to_bytes(8, "big") + b"abc") == []  # peek: 8
    head = cutter.feed(b"defgh")
    assert isinstance(head[0], F.Head) and head[0].size == 1 << 40 and head[0].peek == b"abcdefgh"
    assert cutter.feed(b"b" * 100_000) == [b"b" * 100_000]  # passed through, not kept
    assert cutter.left == (1 << 40) - 100_008 and not cutter._buf


def test_curve_messages_cost_their_part_and_commands_nothing():
    message = F.Head(0, 33 + 100, b"", b"\x07MESSAGE")
    assert F.payload_size(message, curve=True) == 100
    assert F.payload_size(F.Head(zmtp.FLAG_COMMAND, 40, b"", b"\x07MESSAGE"), curve=True) == 7
    assert F.payload_size(F.Head(zmtp.FLAG_COMMAND, 200, b"", b"\x05HELLO\x01\x00"), True) is None
    assert F.payload_size(F.Head(0, 100, b"", b"\x07MESSAGE"), curve=False) == 100


def test_a_stand_in_carries_the_size_and_the_req_id_of_a_submit():
    payload = P.encode(P.Submit(req_id="r-42", prompt="x" * 10_000))
    body = F.standin(len(payload), payload[: F.PREFIX])
    assert body[0] == 0xC1 and len(body) < F.PREFIX + 32
    size, prefix = F.parse_standin(body)
    assert size == len(payload) and prefix_req_id(prefix) == "r-42"
    assert F.parse_standin(payload) is None
    with_session = P.encode(P.Submit(req_id="s" * 300, prompt="p", session="abc"))
    assert prefix_req_id(with_session) == "s" * 300


def test_the_req_id_parser_never_raises():
    rng = random.Random(7)
    good = P.encode(P.Submit(req_id="r1", prompt="hello"))
    for i in range(3000):
        if i % 3 == 0:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        else:  # a submit cut short or with bytes flipped
            data = bytearray(good[: rng.randrange(len(good) + 1)])
            if data and i % 2:
                data[rng.randrange(len(data))] = rng.randrange(256)
        result = prefix_req_id(bytes(data))
        assert result is None or isinstance(result, str)
    assert prefix_req_id(good[:20]) is None  # its req_id is not whole yet


def test_the_ledger_refuses_past_its_limit_and_keeps_a_reserve_for_small_frames():
    mib = 1 << 20
    ledger = InboundLedger(64 * mib)  # reserve: 4 MiB
    assert ledger.reserve == 4 * mib
    big = 8 * mib
    assert sum(ledger.take(b"flood", big) for _ in range(10)) == 7  # 56 of 60 MiB
    while ledger.take(b"flood", 1000):  # the flood's own small frames: up to the reserve
        pass
    assert 60 * mib - cost(1000) < ledger.held <= 60 * mib
    assert ledger.take(b"honest", 1000)  # another connection's: from the reserve
    assert not ledger.take(b"honest", 1000)  # ... one at a time
    assert ledger.take(b"flood", 100, reserve_ok=True)  # a stand-in
    ledger.give_back(b"honest", 1000)
    assert ledger.take(b"honest", 1000)
    assert not ledger.take(b"honest-2", big)  # a big frame never uses the reserve
    ledger.give_back(b"honest", 1000)
    assert b"honest" not in ledger._own


def test_an_empty_ledger_takes_any_frame():
    ledger = InboundLedger(4096)
    assert ledger.take(None, 1 << 20) and not ledger.take(None, 1)
    assert ledger.refusal(10) == 1 and ledger.refused_bytes == 10


def test_the_ledger_settles_drift_once_idle():
    now = [0.0]
    ledger = InboundLedger(1 << 20, idle=1.0, clock=lambda: now[0])
    assert ledger.take(b"c1", 500)  # a frame libzmq will discard: never given back
    now[0] = 5.0
    assert ledger.settle_if_idle() == 0  # its message is in progress: held for real
    ledger.completed(cost(500))  # passed whole (libzmq discards it all the same)
    now[0] = 0.5
    assert ledger.settle_if_idle() == 0  # passed on just now: maybe still on its way
    now[0] = 1.6
    ledger.passing()  # its body still streams: not idle
    assert ledger.settle_if_idle() == 0
    now[0] = 2.7
    assert ledger.settle_if_idle() == 500 + FRAME_COST
    assert ledger.held == 0 and not ledger._own and ledger.settled == 500 + FRAME_COST
    ledger.give_back(b"c1", 500)  # late: never below zero
    assert ledger.held == 0


def test_a_message_abandoned_mid_way_is_given_back_and_a_delivered_one_is_not():
    ledger = InboundLedger(1 << 20)
    assert ledger.take(b"c1", 100) and ledger.take(b"c1", 200)
    ledger.completed(cost(100))  # the first message passed whole
    assert ledger.open == cost(200)
    ledger.abandon(b"c1", cost(200))  # the connection left inside the second
    assert ledger.held == cost(100) and ledger.open == 0
    ledger.give_back(b"c1", 100)  # the daemon reads the first
    assert ledger.held == 0 and not ledger._own


def test_one_connection_holds_at_most_its_share_and_uncounted_frames_give_nothing_back():
    mib = 1 << 20
    ledger = InboundLedger(64 * mib, per_connection=16 * mib)
    assert sum(ledger.take(b"c1", 4 * mib) for _ in range(8)) == 3  # 3 x (4 MiB + 64 B)
    assert "holds" in ledger.last_refusal
    assert ledger.take(b"c2", 4 * mib)  # another connection still finds room
    held = ledger.held
    ledger.give_back(b"link", 4 * mib)  # an in-process link's frame: the gate never took it
    assert ledger.held == held
    ledger.give_back(b"c2", 4 * mib)
    assert ledger.held == held - cost(4 * mib)


def test_the_token_is_found_behind_nested_values_and_the_walk_never_raises():
    submit = P.encode(
        P.Submit(req_id="r1", prompt="p" * 300, sampling=P.Sampling(stop=["a", "b"]), token="t0k")
    )
    assert prefix_field(submit, "token") == "t0k"
    assert prefix_field(submit[:-1], "token") is None  # cut short
    assert prefix_field(P.encode(P.Status(token="op")), "token") == "op"
    rng = random.Random(11)
    for _ in range(3000):
        data = bytearray(submit[: rng.randrange(len(submit) + 1)])
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        found = prefix_field(bytes(data), "token")
        assert found is None or isinstance(found, str)
