"""What HTTP connections send before a request of theirs starts is bounded, per
connection and in all (`fsd.server.http.heads`), against a real daemon."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import urllib.request
from pathlib import Path

from fsd.server.http.heads import HEAD_BYTES
from tests.server.daemon_proc import free_port, pool_config, start_daemon


def _rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _health(base: str) -> int:
    with urllib.request.urlopen(f"{base}/health", timeout=15) as resp:
        return resp.status


def test_unfinished_heads_are_closed_past_their_bytes_and_others_are_served(tmp_path):
    port = free_port()
    total = 16 << 20  # a quarter of the bodies' budget
    config = pool_config(64, 8, 0, http_max_inflight_bytes=4 * total, http_header_timeout=60.0)
    d = start_daemon(tmp_path, config, "--http", f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    socks: list[socket.socket] = []
    try:
        assert _health(base) == 200
        idle = _rss(d.proc.pid)
        line = b"X-Pad: " + b"p" * 8000 + b"\r\n"
        # one connection sends a head past its own bound: closed
        big = socket.create_connection(("127.0.0.1", port), timeout=10)
        head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + line * (HEAD_BYTES // len(line) + 8)
        with contextlib.suppress(OSError):
            big.sendall(head)
        big.settimeout(10)
        with contextlib.suppress(ConnectionResetError):  # closed, not answered (a timeout fails)
            assert big.recv(1000) == b""
        big.close()
        # 60 connections each send 100 header lines of 8 KB (48 MB in all), never ending
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        for _ in range(100):
            for s in socks:
                with contextlib.suppress(OSError):  # closed for what all of them hold
                    s.send(line)
        time.sleep(1.0)
        grown = _rss(d.proc.pid) - idle
        print(f"RSS +{grown / 1e6:.0f} MB with 60 unfinished heads of 800 KB")
        assert grown < 2 * total + (40 << 20), grown
        assert _health(base) == 200  # an honest request is served meanwhile
        assert "bytes of unfinished heads" in d.log.read_text()
    finally:
        for s in socks:
            s.close()
        assert d.stop() == 0
