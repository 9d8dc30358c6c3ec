"""Who a connection's peer is (`fsd.server.transport.peers`): a local user, whatever the socket."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from fsd.server.transport.peers import peer_of


def _pair(family: int, addr) -> tuple[socket.socket, socket.socket, socket.socket]:
    srv = socket.socket(family)
    srv.bind(addr)
    srv.listen()
    client = socket.socket(family)
    client.connect(srv.getsockname())
    conn, _ = srv.accept()
    return srv, client, conn


@pytest.mark.parametrize("family", [socket.AF_UNIX, socket.AF_INET])
def test_a_local_peer_is_its_user(family, tmp_path):
    addr = str(tmp_path / "s") if family == socket.AF_UNIX else ("127.0.0.1", 0)
    socks = _pair(family, addr)
    try:
        assert peer_of(socks[2]) == f"uid:{os.getuid()}"
    finally:
        for s in socks:
            s.close()


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_another_local_user_on_loopback_tcp_is_told_apart():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    code = f"import socket,time; s=socket.create_connection(('127.0.0.1',{port})); time.sleep(3)"
    proc = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code]
    )
    try:
        srv.settimeout(10)
        conn, _ = srv.accept()
        assert peer_of(conn) == "uid:65534"
        conn.close()
    finally:
        proc.kill()
        srv.close()


def test_a_closed_or_missing_socket_is_unknown_not_an_error():
    assert peer_of(None) == "?"
    s = socket.socket()
    s.close()
    assert peer_of(s) == "?"
