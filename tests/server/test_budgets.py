"""Memory the daemon holds for its clients is bounded in bytes (P21): a flood of big
frames is refused ("overloaded") while an honest client is served, a client that never
reads its replies is dropped with its jobs, and so is a telemetry subscriber that never
reads. Real daemons, real sockets; RSS read from /proc."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import msgspec
import zmq
import zmq.auth

from fsd import protocol as P
from fsd.client import CurveKeys
from fsd.server.security import generate_keys
from fsd.server.transport import zmtp
from tests.server.daemon_proc import Daemon, free_port, pool_config, raw, start_daemon

MIB = 1 << 20


def rss(pid: int) -> int:
    """Resident bytes of process `pid` (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def metric(d: Daemon, name: str) -> float:
    """The sum of a metric's samples in /metrics."""
    with urllib.request.urlopen(f"{d.http}/metrics", timeout=30) as resp:  # type: ignore[attr-defined]
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def with_http(tmp: Path, config: str) -> Daemon:
    port = free_port()
    d = start_daemon(tmp, config, "--http", f"127.0.0.1:{port}")
    d.http = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return d


class RawPeer:
    """A ZMTP NULL peer on a plain TCP socket: it sends what a test writes and reads
    only when told (a small receive buffer, so what it leaves unread stays with the daemon)."""

    def __init__(self, endpoint: str, socket_type: bytes = b"DEALER") -> None:
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        self.sock.sendall(zmtp.greeting() + zmtp.ready([(b"Socket-Type", socket_type)]))
        got = b""  # libzmq drops a peer whose messages arrive before its own READY went out
        while len(got) < 66 or len(got) < 66 + got[65]:
            got += self.sock.recv(4096)

    def send(self, payload: bytes) -> None:
        self.sock.sendall(zmtp.frame(payload))

    def close(self) -> None:
        self.sock.close()


def _big_submit(req_id: str, size: int) -> bytes:
    """A frame of `size` bytes that starts as a Submit (its prompt is bytes: invalid)."""
    head = msgspec.msgpack.encode({"type": "submit", "req_id": req_id, "prompt": b""})
    return msgspec.msgpack.encode(
        {"type": "submit", "req_id": req_id, "prompt": b"x" * (size - len(head) - 4)}
    )


def _replies(sock: zmq.Socket, wait: float) -> list[P.Reply]:
    out, deadline = [], time.time() + wait
    while time.time() < deadline:
        if sock.poll(200):
            out.append(P.decode_reply(sock.recv_multipart()[-1]))
        elif out:
            break
    return out


def test_a_flood_of_big_frames_is_refused_and_an_honest_client_is_served(tmp_path: Path):
    d = with_http(tmp_path, pool_config(64, 8, 10, max_inbound_bytes=16 * MIB))
    try:
        idle = rss(d.proc.pid)
        frames = [_big_submit(f"big-{i}", 8 * MIB) for i in range(4)]
        flood = raw(d)
        flood.setsockopt(zmq.SNDHWM, 0)
        peak, answered = idle, None
        with d.client(timeout=30.0) as honest:
            for i in range(200):
                flood.send(frames[i % 4], copy=False)  # the same buffers: no copies here
                if i % 20 == 0:
                    peak = max(peak, rss(d.proc.pid))
                if i == 100:
                    t0 = time.time()
                    honest.status()
                    answered = time.time() - t0
            deadline = time.time() + 120
            while time.time() < deadline and flood.getsockopt(zmq.EVENTS) & zmq.POLLOUT == 0:
                peak = max(peak, rss(d.proc.pid))
                time.sleep(0.1)
            replies = _replies(flood, 60.0)
            peak = max(peak, rss(d.proc.pid))
            honest.status()
        codes = [r.code for r in replies if isinstance(r, P.Error)]
        overloaded = [r for r in replies if isinstance(r, P.Error) and r.code == "overloaded"]
        print(f"idle RSS {idle / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB; {len(replies)} replies, "
              f"{len(overloaded)} overloaded; honest status in {answered:.2f} s")
        assert peak - idle < 200 * MIB, (idle, peak)
        assert overloaded and all(r.req_id and r.req_id.startswith("big-") for r in overloaded)
        assert set(codes) <= {"overloaded", "invalid", "malformed"}
        assert answered is not None and answered < 10.0
        assert metric(d, "fsd_inbound_refused_frames_total") >= len(overloaded)
        flood.close()
    finally:
        assert d.stop() == 0


def test_a_client_that_never_reads_its_replies_is_dropped_and_its_jobs_aborted(tmp_path: Path):
    config = pool_config(64, 4, 10, max_client_backlog_bytes=2 * MIB, client_timeout=120.0)
    d = with_http(tmp_path, config)
    try:
        idle = rss(d.proc.pid)
        greedy = RawPeer(d.endpoint)
        for i in range(3000):  # jobs that stay live (a small batch, long outputs)
            sampling = P.Sampling(max_tokens=900, ignore_eos=True)
            greedy.send(P.encode(P.Submit(req_id=f"g{i}", prompt="hello there", sampling=sampling)))
        with d.client(timeout=30.0) as other:
            deadline = time.time() + 60
            while other.status().jobs < 3000 and time.time() < deadline:
                time.sleep(0.2)
            assert other.status().jobs == 3000
            listing = P.encode(P.ListJobs())
            peak, dropped = idle, False
            try:
                for i in range(5000):
                    greedy.send(listing)
                    if i % 50 == 0:
                        peak = max(peak, rss(d.proc.pid))
            except OSError:
                dropped = True  # the daemon closed the connection: the writes fail
            deadline = time.time() + 60
            while time.time() < deadline and other.status().jobs:
                time.sleep(0.2)
            assert other.status().jobs == 0  # aborted at once (client_timeout is 120 s)
        print(f"idle RSS {idle / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB")
        assert dropped or metric(d, "fsd_gate_dropped_connections_total") >= 1
        assert metric(d, "fsd_gate_dropped_connections_total") >= 1
        assert peak - idle < 300 * MIB
        assert "its connection was dropped" in d.log.read_text()
        greedy.close()
    finally:
        assert d.stop() == 0


def test_subscribers_that_never_read_are_dropped_and_a_reader_keeps_its_snapshots(tmp_path):
    config = pool_config(
        64, 8, 50, max_subscriber_backlog_bytes=64 * 1024, client_timeout=120.0
    )
    d = with_http(tmp_path, config)
    try:
        idle = rss(d.proc.pid)
        stuck = [RawPeer(d.telemetry, b"SUB") for _ in range(10)]
        for peer in stuck:
            peer.send(b"\x01")  # subscribe to everything
        owner = RawPeer(d.endpoint)  # a job table in each snapshot, and events
        sampling = P.Sampling(max_tokens=900, ignore_eos=True)
        for i in range(200):
            owner.send(P.encode(P.Submit(req_id=f"p{i}", prompt="hello", sampling=sampling)))
        deadline = time.time() + 90
        while time.time() < deadline and metric(d, "fsd_gate_dropped_connections_total") < 10:
            assert d.snapshot(timeout=10.0).seq > 0  # a reader keeps getting them
            time.sleep(0.5)
        dropped = metric(d, "fsd_gate_dropped_connections_total")
        print(f"idle RSS {idle / MIB:.0f} MiB, now {rss(d.proc.pid) / MIB:.0f} MiB; {dropped} dropped")
        assert dropped == 10
        assert rss(d.proc.pid) - idle < 100 * MIB
        assert d.snapshot(timeout=10.0).seq > 0
        for peer in [*stuck, owner]:
            peer.close()
    finally:
        assert d.stop() == 0


def _curve_socket(kind: int, endpoint: str, keys: dict) -> zmq.Socket:
    server = zmq.auth.load_certificate(str(keys["server_public"]))[0]
    public, secret = zmq.auth.load_certificate(str(keys["client-1_secret"]))
    s = zmq.Context.instance().socket(kind)
    s.setsockopt(zmq.LINGER, 0)
    s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server, public, secret
    s.connect(endpoint)
    return s


def test_under_curve_a_flood_waits_for_room_and_normal_traffic_works(tmp_path: Path):
    keys = generate_keys(tmp_path / "keys", clients=1)
    config = pool_config(
        64, 8, 10, max_inbound_bytes=16 * MIB,
        curve_secret_key=str(keys["server_secret"]), curve_authorized_dir=str(keys["authorized"]),
    )  # fmt: skip
    creds = CurveKeys(
        server_public=str(keys["server_public"]), client_secret=str(keys["client-1_secret"])
    )
    d = start_daemon(tmp_path, config, curve=creds)
    try:
        idle = rss(d.proc.pid)
        flood = _curve_socket(zmq.DEALER, d.endpoint, keys)
        flood.setsockopt(zmq.SNDHWM, 0)
        frame = _big_submit("big", 8 * MIB - 4096)
        peak = idle
        with d.client(timeout=30.0) as honest:
            for i in range(60):
                flood.send(frame, copy=False)
                if i % 10 == 0:
                    peak = max(peak, rss(d.proc.pid))
            t0 = time.time()
            honest.status()
            answered = time.time() - t0
            replies = _replies(flood, 90.0)
            peak = max(peak, rss(d.proc.pid))
            job = honest.submit("hello", max_tokens=4)
            assert job.result(timeout=60).finish_reason in ("stop", "length")
        sub = _curve_socket(zmq.SUB, d.telemetry, keys)  # telemetry through its gate
        sub.setsockopt(zmq.SUBSCRIBE, P.TOPIC_SNAPSHOT)
        assert sub.poll(10_000) and P.decode_snapshot(sub.recv_multipart()[1]).seq > 0
        sub.close()
        print(f"CURVE: idle RSS {idle / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB; "
              f"{len(replies)} replies; honest status in {answered:.2f} s")
        assert len(replies) == 60  # each waited for room; none was lost
        assert all(isinstance(r, P.Error) and r.code != "overloaded" for r in replies)
        assert peak - idle < 200 * MIB, (idle, peak)
        assert answered < 10.0
        flood.close()
    finally:
        assert d.stop() == 0
