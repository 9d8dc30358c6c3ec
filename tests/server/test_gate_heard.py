"""A stalled gate is not its clients' silence: frames waiting in the gate's loop do
not count against a session (`Gate.heard_until`, used by the session reaper)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import zmq

from fsd.server.loop.service import EngineService
from fsd.server.transport import zmtp
from fsd.server.transport.gate import Gate
from fsd.server.transport.relay import Limits


def _gate(tmp: Path) -> tuple[Gate, zmq.Socket, zmq.Socket]:
    gate = Gate(
        f"ipc://{tmp}/public", limits=Limits(False, zmtp.REQUEST_PEERS, 1 << 20), max_connections=8
    )
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(gate.upstream)
    gate.start()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"ipc://{tmp}/public")
    return gate, router, dealer


def test_heard_until_stays_behind_a_stall_and_moves_on_after_it(tmp_path):
    gate, router, dealer = _gate(tmp_path)
    try:
        dealer.send(b"hello")
        assert router.poll(10_000) and router.recv_multipart()[1] == b"hello"
        stalled, began = threading.Event(), []

        def stall() -> None:  # the gate's thread starved: its loop does not turn
            began.append(time.time())
            stalled.set()
            time.sleep(1.5)

        assert gate._loop is not None
        gate._loop.call_soon_threadsafe(stall)
        assert stalled.wait(10)
        sent = time.time()
        dealer.send(b"ping")
        assert not router.poll(500)  # the ping waits in the gate, unread by the daemon
        assert gate.heard_until <= began[0] < sent  # so its silence does not count
        assert router.poll(10_000) and router.recv_multipart()[1] == b"ping"
        deadline = time.time() + 10
        while gate.heard_until <= sent and time.time() < deadline:
            time.sleep(0.02)
        assert gate.heard_until > sent  # relayed: the gate vouches for that time again
    finally:
        dealer.close()
        router.close()
        gate.close()


def test_the_reaper_counts_silence_only_while_both_the_daemon_and_the_gate_listened():
    seen: list[float] = []
    routing = SimpleNamespace(reap_silent_clients=lambda timeout, heard: seen.append(heard) or [])
    service = SimpleNamespace(
        frontend=SimpleNamespace(caught_up=200.0),
        gate=SimpleNamespace(heard_until=150.0),
        routing=routing,
        cfg=SimpleNamespace(client_timeout=2.0),
        control=None,
    )
    EngineService._reap(service)  # type: ignore[arg-type]
    service.gate.heard_until = 250.0
    EngineService._reap(service)  # type: ignore[arg-type]
    service.gate = None  # an inproc:// endpoint has no gate
    EngineService._reap(service)  # type: ignore[arg-type]
    assert seen == [150.0, 200.0, 200.0]
