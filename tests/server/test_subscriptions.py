"""A telemetry subscriber holds at most a few KB of the PUB: only subscriptions to
the telemetry's topics pass the gate (`fsd.server.transport.subscriptions`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
from pathlib import Path

import zmq

from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.server.transport import zmtp
from fsd.server.transport.endpoints import telemetry_gate, tune_pub
from fsd.server.transport.subscriptions import MAX_DROPPED, MAX_SUBSCRIPTIONS, SubscriptionFrames

TOPICS = (P.TOPIC_SNAPSHOT, P.TOPIC_EVENT)


def _feed(frames: SubscriptionFrames, data: bytes, step: int = 7) -> tuple[bytes, bool]:
    """What passes of `data` fed in pieces of `step` bytes, and whether it may go on."""
    out: list[bytes] = []
    for i in range(0, len(data), step):
        if not asyncio.run(frames.feed(data[i : i + step], out)):
            return b"".join(out), False
    return b"".join(out), True


def test_subscriptions_to_the_topics_pass_and_nothing_else_does():
    frames = SubscriptionFrames(b"c1", TOPICS, curve=False)
    good = [
        zmtp.frame(b"\x01" + P.TOPIC_SNAPSHOT),  # ZMTP 3.0: a message
        zmtp.frame(b"\x01"),  # everything
        zmtp.frame(b"\x01" + P.TOPIC_EVENT[:2]),  # a prefix of a topic
        zmtp.frame(b"\x00" + P.TOPIC_SNAPSHOT),  # a cancel
        zmtp.frame(b"\x09SUBSCRIBE" + P.TOPIC_EVENT, command=True),  # ZMTP 3.1
        zmtp.frame(b"\x06CANCEL" + P.TOPIC_EVENT, command=True),
        zmtp.frame(b"\x04PING\x00\x10ctx", command=True),  # heartbeats pass
    ]
    bad = [
        zmtp.frame(b"\x01" + P.TOPIC_SNAPSHOT + b"x"),  # matches no topic
        zmtp.frame(b"\x01" + os.urandom(60_000)),  # a 60 KB trie branch
        zmtp.frame(b"\x09SUBSCRIBE" + os.urandom(300), command=True),
        zmtp.frame(b"\x01" + P.TOPIC_SNAPSHOT, more=True) + zmtp.frame(b"\x01"),  # multipart
        zmtp.frame(b"hello"),  # not a subscription
        zmtp.frame(b"\x05HELLO", command=True),  # another command
    ]
    stream = b"".join(x for pair in itertools.zip_longest(good, bad, fillvalue=b"") for x in pair)
    passed, going = _feed(frames, stream)
    assert going and passed == b"".join(good)
    assert frames.dropped == len(bad) + 1  # (the multipart message is two frames)


def test_a_subscriber_is_closed_past_its_subscriptions_or_its_dropped_frames():
    frames = SubscriptionFrames(b"c1", TOPICS, curve=False)
    _, going = _feed(frames, zmtp.frame(b"\x01x") * MAX_DROPPED)
    assert going
    _, going = _feed(frames, zmtp.frame(b"\x01x"))
    assert not going
    frames = SubscriptionFrames(b"c2", TOPICS, curve=False)
    passed, going = _feed(frames, zmtp.frame(b"\x01") * (MAX_SUBSCRIPTIONS + 5))
    assert going and passed == zmtp.frame(b"\x01") * MAX_SUBSCRIPTIONS  # the rest dropped


def test_under_curve_a_subscriber_may_pass_a_few_short_messages_only():
    message = zmtp.frame(b"\x07MESSAGE" + b"n" * 8 + os.urandom(40), command=True)
    frames = SubscriptionFrames(b"c1", TOPICS, curve=True)
    passed, going = _feed(frames, message * MAX_SUBSCRIPTIONS)
    assert going and passed == message * MAX_SUBSCRIPTIONS
    assert not _feed(frames, message)[1]  # one more: closed
    long = zmtp.frame(b"\x07MESSAGE" + b"n" * 8 + os.urandom(60_000), command=True)
    assert not _feed(SubscriptionFrames(b"c2", TOPICS, curve=True), long)[1]


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_subscription_flood_holds_nothing_and_a_subscriber_still_gets_its_snapshots(tmp_path):
    gate = telemetry_gate(ServerConfig(telemetry_endpoint=f"ipc://{tmp_path}/t"), curve=False)
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    tune_pub(pub)
    pub.bind(gate.upstream)
    gate.start()
    sub = ctx.socket(zmq.SUB)
    floods: list[socket.socket] = []
    try:
        sub.setsockopt(zmq.SUBSCRIBE, P.TOPIC_SNAPSHOT)
        sub.connect(f"ipc://{tmp_path}/t")
        flood = b"".join(  # 200 subscriptions of 60 KB: 576 MB a connection before
            [zmtp.frame(b"\x09SUBSCRIBE" + os.urandom(60_000), command=True) for _ in range(100)]
            + [zmtp.frame(b"\x01" + os.urandom(60_000)) for _ in range(100)]
        )
        before = _rss()
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX)
            s.connect(f"{tmp_path}/t")
            s.sendall(zmtp.greeting() + zmtp.ready([(b"Socket-Type", b"SUB")]))
            got = b""  # the PUB's greeting and READY: libzmq drops frames sent before it
            while len(got) < 66 or len(got) < 66 + got[65]:
                got += s.recv(4096)
            with contextlib.suppress(OSError):  # closed past its dropped frames
                s.sendall(flood)
            floods.append(s)
        got = False
        deadline = time.time() + 10
        while time.time() < deadline and not got:  # the PUB reads subscriptions as it sends
            pub.send_multipart([P.TOPIC_SNAPSHOT, b"snap"])
            got = bool(sub.poll(50)) and sub.recv_multipart()[1] == b"snap"
        for _ in range(20):
            pub.send_multipart([P.TOPIC_SNAPSHOT, b"snap"])
            time.sleep(0.02)
        grown = _rss() - before
        assert got
        assert grown < 20 << 20, grown
        assert gate.live == 1  # each flood was closed; the honest subscriber stays
    finally:
        for s in floods:
            s.close()
        sub.close(0)
        pub.close(0)
        gate.close()
