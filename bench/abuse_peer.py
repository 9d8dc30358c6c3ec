"""Raw ZMTP peers for bench/abuse_slots.py, in the standard library only, so that they
can run as another user (`setpriv ... /usr/bin/python3 bench/abuse_peer.py`), who is
not the daemon's owner and so not its local operator.

    abuse_peer.py hoard ENDPOINT KIND N SECONDS     N connections that handshake (KIND:
                                                    DEALER or SUB) and say nothing
    abuse_peer.py cycle ENDPOINT N SECONDS          N connections that send a CURVE
                                                    greeting and nothing more, each
                                                    reopened as soon as it is closed
    abuse_peer.py ask ENDPOINT HEXFRAME TRIES       a fresh connection per try sends the
                                                    frame; prints each reply's latency
                                                    and its first bytes, as JSON lines

It prints one JSON line when its connections are up ({"up": n, "refused": m}).
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import struct
import sys
import time
from urllib.parse import urlsplit


def greeting(mechanism: bytes = b"NULL") -> bytes:
    return b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\x00") + b"\x00" * 32


def frame(body: bytes, command: bool = False) -> bytes:
    flags = 0x04 if command else 0
    if len(body) < 256:
        return bytes([flags, len(body)]) + body
    return bytes([flags | 0x02]) + struct.pack(">Q", len(body)) + body


def ready(kind: bytes) -> bytes:
    name = b"Socket-Type"
    return frame(b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(kind)) + kind, True)


def connect(endpoint: str) -> socket.socket:
    if endpoint.startswith("ipc://"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(endpoint[len("ipc://") :])
        return s
    parts = urlsplit(endpoint)
    return socket.create_connection((parts.hostname, parts.port), timeout=10)


def read_frame(
    s: socket.socket, deadline: float, ready_only: bool = False, greeted: bool = True
) -> bytes | None:
    """The next data frame's body (commands skipped; with `ready_only` the first
    command's, the greeting first unless `greeted`); None if the peer closed or time ran out."""
    buf = b""
    while True:
        if not greeted and len(buf) >= 64:
            buf, greeted = buf[64:], True
        while greeted and len(buf) >= 2:
            long = buf[0] & 0x02
            start = 9 if long else 2
            if len(buf) < start:
                break
            size = struct.unpack_from(">Q", buf, 1)[0] if long else buf[1]
            if len(buf) < start + size:
                break
            body, command = buf[start : start + size], buf[0] & 0x04
            buf = buf[start + size :]
            if bool(command) == ready_only:
                return body
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = s.recv(65536)
        except (TimeoutError, OSError):
            return None
        if not data:
            return None
        buf += data


def hoard(endpoint: str, kind: str, n: int, seconds: float) -> None:
    socks, refused = [], 0
    for _ in range(n):
        try:
            s = connect(endpoint)
            s.sendall(greeting() + ready(kind.encode()))
            socks.append(s)
        except OSError:
            refused += 1
    print(json.dumps({"up": len(socks), "refused": refused}), flush=True)
    time.sleep(seconds)


def cycle(endpoint: str, n: int, seconds: float) -> None:
    """CURVE greetings that never go on: each reopened when closed or after 1 s."""
    sel = selectors.DefaultSelector()
    opened: dict[socket.socket, float] = {}
    reopened = 0

    def open_one() -> None:
        try:
            s = connect(endpoint)
            s.setblocking(False)
            s.send(greeting(b"CURVE"))
            opened[s] = time.monotonic()
            sel.register(s, selectors.EVENT_READ)
        except OSError:
            pass

    for _ in range(n):
        open_one()
    print(json.dumps({"up": len(opened), "refused": n - len(opened)}), flush=True)
    end = time.monotonic() + seconds  # each held until the daemon closes it, then reopened
    while time.monotonic() < end:
        for key, _ in sel.select(0.1):
            s = key.fileobj
            try:
                data = s.recv(65536)  # type: ignore[union-attr]
            except OSError:
                data = b""
            if not data:
                sel.unregister(s)
                opened.pop(s, None)  # type: ignore[arg-type]
                s.close()  # type: ignore[union-attr]
        while len(opened) < n and time.monotonic() < end:
            open_one()
            reopened += 1
    print(json.dumps({"reopened": reopened}), flush=True)


def ask(endpoint: str, hexframe: str, tries: int) -> None:
    body = bytes.fromhex(hexframe)
    for _ in range(tries):
        began = time.monotonic()
        try:
            s = connect(endpoint)
            s.sendall(greeting() + ready(b"DEALER"))
            reply = read_frame(s, began + 30, ready_only=True, greeted=False)  # its READY: then we may speak
            if reply is not None:
                s.sendall(frame(body))
                reply = read_frame(s, began + 30)
            s.close()
        except OSError as exc:
            reply = repr(exc).encode()
        took = time.monotonic() - began
        head = (reply or b"")[:60].decode("latin-1")
        print(json.dumps({"s": round(took, 3), "reply": head}), flush=True)
        time.sleep(0.2)


def main() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    what, endpoint, *rest = sys.argv[1:]
    if what == "hoard":
        hoard(endpoint, rest[0], int(rest[1]), float(rest[2]))
    elif what == "cycle":
        cycle(endpoint, int(rest[0]), float(rest[1]))
    elif what == "ask":
        ask(endpoint, rest[0], int(rest[1]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
