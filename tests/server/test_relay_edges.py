"""A gate connection's edges, through a real gate and ROUTER: what a connection that
leaves mid-frame holds (nothing), the daemon's last replies to a client that reads
late (all delivered), and a command frame no budget counts (refused)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from fsd.server.transport import zmtp
from fsd.server.transport.gate import Gate
from fsd.server.transport.inbound import MAX_COMMAND
from fsd.server.transport.ledger import InboundLedger, cost
from fsd.server.transport.relay import Limits

HELLO = zmtp.greeting() + zmtp.ready([(b"Socket-Type", b"DEALER")])


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[Gate, zmq.Socket, InboundLedger, str]]:
    ledger = InboundLedger(64 << 20)
    limits = Limits(False, zmtp.REQUEST_PEERS, 64 << 20, ledger, max_frame=16 << 20)
    gate = Gate(f"ipc://{tmp_path}/public", limits=limits, max_connections=8)
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 10_000)
    router.bind(gate.upstream)
    gate.start()
    yield gate, router, ledger, f"{tmp_path}/public"
    router.close(0)
    gate.close()


def _connect(path: str) -> socket.socket:
    """A DEALER's handshake by hand, done (libzmq drops a peer whose data comes before
    its own READY went out)."""
    s = socket.socket(socket.AF_UNIX)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the client reads little
    s.settimeout(10)
    s.connect(path)
    s.sendall(HELLO)
    _read_exactly(s, 64)  # the ROUTER's greeting
    _, size = _read_exactly(s, 2)  # its READY (a short command frame)
    _read_exactly(s, size)
    return s


def _read_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, "the gate closed the connection"
        data += chunk
    return data


def _until(cond, timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while not cond() and time.time() < deadline:
        time.sleep(0.01)
    return cond()


def _read_to_end(s: socket.socket) -> int:
    s.settimeout(10)
    total = 0
    while chunk := s.recv(1 << 16):
        total += len(chunk)
    return total


def test_a_connection_that_leaves_mid_frame_holds_no_budget(gated):
    _, router, ledger, path = gated
    s = _connect(path)
    s.sendall(b"\x02" + struct.pack(">Q", 1 << 20) + b"x" * 100)  # 1 MiB declared, 100 sent
    assert _until(lambda: ledger.held > 1 << 20)  # counted when its head passed
    s.close()
    assert _until(lambda: ledger.held == 0)  # libzmq discards it: the relay gave it back
    assert not ledger._own and ledger.open == 0
    assert not router.poll(100)  # nothing was delivered


def test_a_message_cut_short_holds_nothing_and_a_whole_one_is_delivered(gated):
    _, router, ledger, path = gated
    s = _connect(path)
    s.sendall(zmtp.frame(b"whole") + zmtp.frame(b"part-1", more=True) + b"\x00\x09part")
    assert router.poll(10_000) and router.recv_multipart()[1] == b"whole"
    s.close()
    # the cut message's parts are given back; the whole one waits for the daemon's read
    assert _until(lambda: ledger.held == cost(len(b"whole")))
    assert ledger.open == 0
    assert not router.poll(200)  # the cut message never arrives


def test_the_daemons_last_replies_reach_a_client_that_reads_late(gated):
    _, router, _, path = gated
    s = _connect(path)
    s.sendall(zmtp.frame(b"hi"))
    assert router.poll(10_000)
    route = router.recv_multipart()[0]
    part = b"r" * 65536
    for _ in range(64):  # 4 MiB the client does not read yet
        router.send_multipart([route, part])
    router.close(10_000)  # the daemon's side ends (a shutdown): the gate must flush
    time.sleep(0.5)
    assert _read_to_end(s) >= 64 * len(part)


def test_a_command_frame_past_the_limit_closes_the_connection_at_its_head(gated):
    _, router, ledger, path = gated
    s = _connect(path)
    flags = zmtp.FLAG_COMMAND | zmtp.FLAG_LONG
    s.sendall(bytes([flags]) + struct.pack(">Q", MAX_COMMAND + 1) + b"\x04PINGxyz")
    _read_to_end(s)  # closed at once: the body libzmq would hold is never awaited
    assert ledger.held == 0 and not router.poll(100)


@pytest.mark.parametrize(
    "command", [b"\x09SUBSCRIBE" + b"t" * 60_000, b"\x06CANCELtopic", b"\x05HELLOx"]
)
def test_a_command_a_dealer_never_sends_closes_the_connection_and_reaches_nobody(gated, command):
    _, router, ledger, path = gated
    s = _connect(path)
    s.sendall(zmtp.frame(command, command=True) + zmtp.frame(b"after"))
    _read_to_end(s)  # closed
    assert not router.poll(300)  # neither the command nor what followed reached the ROUTER
    assert ledger.held == 0


def test_heartbeats_pass_and_the_daemon_answers_them(gated):
    _, router, _, path = gated
    s = _connect(path)
    s.sendall(zmtp.frame(b"\x04PING\x00\x0a" + b"ctx", command=True) + zmtp.frame(b"hi"))
    assert router.poll(10_000) and router.recv_multipart()[1] == b"hi"
    s.settimeout(10)
    assert b"PONG" in s.recv(100)  # libzmq's answer came through
