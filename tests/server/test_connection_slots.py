"""Connection slots cannot be hoarded, against a real daemon: idle and stuck connections
make room for newcomers, a peer has a share, and the operator always gets in
(`fsd.server.transport.slots`, `fsd.server.transport.probation`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import zmq

from fsd import protocol as P
from fsd.server.transport import zmtp
from fsd.server.transport.gate import Gate
from fsd.server.transport.relay import Limits
from fsd.server.transport.slots import IDLE_AFTER
from tests.server.daemon_proc import Daemon, pool_config, start_daemon
from tests.server.test_identity import collect, dealer


def _raw(endpoint: str, kind: bytes) -> socket.socket:
    """A peer that finishes its NULL handshake and then says nothing."""
    host, port = urlsplit(endpoint).hostname, urlsplit(endpoint).port
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(zmtp.greeting() + zmtp.ready([(b"Socket-Type", kind)]))
    return s


def _answered(d: Daemon, operator: bool) -> float:
    """Seconds until a fresh SDK client's status is answered."""
    began = time.perf_counter()
    with d.client(timeout=15.0, operator=operator) as c:
        c.status()
    return time.perf_counter() - began


def test_idle_connections_make_room_for_the_operator_and_a_new_client(tmp_path):
    config = pool_config(64, 8, 10, max_connections=48, client_timeout=60.0)
    d = start_daemon(tmp_path, config)
    hoard: list[socket.socket] = []
    try:
        for _ in range(60):  # more than the table: the last ones wait or are refused
            hoard.append(_raw(d.endpoint, b"DEALER"))
            hoard.append(_raw(d.telemetry, b"SUB"))
        time.sleep(IDLE_AFTER + 0.5)  # they are idle now
        took = [_answered(d, operator=True) for _ in range(5)]
        took += [_answered(d, operator=False) for _ in range(3)]
        print(f"status with 48 slots held idle: {', '.join(f'{t:.2f}' for t in took)} s")
        assert max(took) < 15.0
        assert d.snapshot(timeout=15.0).seq > 0  # a subscriber got in too
        assert "its slot went to a newcomer" in d.log.read_text()
    finally:
        for s in hoard:
            s.close()
        assert d.stop() == 0


def test_connections_stuck_in_their_curve_handshake_make_room(tmp_path):
    from fsd.server.security import generate_keys
    from tests.server.daemon_proc import curve_daemon

    keys = generate_keys(tmp_path / "keys", clients=1, operators=1)
    d = curve_daemon(tmp_path, keys, "operator-1", "max_connections = 24\n", True)
    stuck: list[socket.socket] = []
    try:
        host, port = urlsplit(d.endpoint).hostname, urlsplit(d.endpoint).port
        for _ in range(30):  # a CURVE greeting, then nothing: no key to go on with
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(zmtp.greeting(b"CURVE"))
            stuck.append(s)
        time.sleep(1.5)
        for _ in range(5):
            began = time.perf_counter()
            with d.client(timeout=15.0) as c:
                assert c.status().role == "operator"
            assert time.perf_counter() - began < 15.0
    finally:
        for s in stuck:
            s.close()
        assert d.stop() == 0


class _Busy:
    """Connections that keep their slots busy: each sends a Ping every 0.2 s."""

    def __init__(self, endpoint: str, n: int) -> None:
        self.socks = [dealer(endpoint) for _ in range(n)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for s in self.socks:
                s.send(P.encode(P.Ping()))
                while s.poll(0):
                    s.recv()
            time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self.socks:
            s.close()


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[tuple[Gate, str]]:
    """A request gate of 8 slots (4 a peer) before a ROUTER that echoes every message;
    its owner is nobody here, so this test's peers are not the local operator."""
    g = Gate(
        f"ipc://{tmp_path}/public",
        limits=Limits(False, zmtp.REQUEST_PEERS, 1 << 20),
        max_connections=8,
        max_per_peer=4,
    )
    g.operator_token, g.local_operator = "op-token", "uid:-1"
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(g.upstream)
    g.start()
    stop = threading.Event()

    def echo() -> None:
        while not stop.is_set():
            if router.poll(50):
                router.send_multipart(router.recv_multipart())

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    yield g, f"ipc://{tmp_path}/public"
    stop.set()
    thread.join(5)
    router.close()
    g.close()


def test_busy_connections_leave_the_operator_its_reserve_and_a_peer_its_share(gate):
    g, endpoint = gate
    busy = _Busy(endpoint, 6)  # one peer, busy: 4 get in, 2 are refused (and retry)
    try:
        time.sleep(1.0)
        assert g.live == 4, (dict(g.table.peers), g.probations)
        probe = dealer(endpoint)  # the same peer, no token: its share is full, none idle
        probe.send(P.encode(P.Status()))
        [error] = collect(probe, 10, P.Error)
        assert error.code == "too-many-connections" and "holds 4 connections" in error.message
        probe.close()
        ops = []
        for _ in range(3):  # the operator's token: a reserved slot, its frames echoed
            op = dealer(endpoint)
            op.send(P.encode(P.Status(token="op-token")))
            op.send(b"second")
            assert op.poll(10_000) and P.decode_request(op.recv()) == P.Status(token="op-token")
            assert op.poll(10_000) and op.recv() == b"second"
            ops.append(op)
        assert g.live == 7 and sum(s.operator for s in g.table.slots.values()) == 3
        wrong = dealer(endpoint)
        wrong.send(P.encode(P.Status(token="guess")))
        assert [e.code for e in collect(wrong, 10, P.Error)] == ["too-many-connections"]
        wrong.close()
        for op in ops:
            op.close()
    finally:
        busy.close()
