"""The peer reproductions of issue P22 for bench/abuse.py: subscription floods, commands
on the request port, and connection slots hoarded idle or stuck in a CURVE handshake.

The hoarders and the honest newcomer run as another user where the bench runs as root
(`setpriv`, the raw peers of bench/abuse_peer.py on the system's python3), so that
they are not the daemon's owner, whom the daemon trusts as its local operator; the
operator is timed with its token, as `fsctl status` sends it. Each case returns its
outcome line and figures; the targets are checked in bench/abuse_report.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from abuse_cases import Ctx

from fsd import protocol as P
from fsd.client import Client, CurveKeys
from fsd.server.security import generate_keys
from fsd.server.transport import zmtp
from fsd.server.transport.slots import IDLE_AFTER
from tests.server.daemon_proc import start_daemon
from tests.server.test_budgets import metric

PEER = str(Path(__file__).resolve().parent / "abuse_peer.py")
TRIES = 5
OPERATOR_S, NEWCOMER_S = 1.0, 2.0  # the targets


def _other_user() -> list[str]:
    """The command prefix that runs a raw peer as nobody (else as this user)."""
    if os.getuid() == 0 and shutil.which("setpriv") and Path("/usr/bin/python3").exists():
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]
    return [sys.executable]


def _peer(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([*_other_user(), PEER, *map(str, args)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # {"up": n, ...}: its connections are open
    return proc


def _ask(endpoint: str, msg: P.Request) -> list[float]:
    """A newcomer's latencies (TRIES fresh connections, as another user): inf if refused."""
    out = subprocess.run([*_other_user(), PEER, "ask", endpoint, P.encode(msg).hex(), str(TRIES)],
                         capture_output=True, text=True, timeout=300).stdout  # fmt: skip
    got = [json.loads(line) for line in out.splitlines()]
    return [g["s"] if "reply" in g["reply"] else float("inf") for g in got]


def _operator(endpoint: str, token: str | None, curve: CurveKeys | None = None) -> list[float]:
    """The operator's `fsctl status`: a fresh client with its token, TRIES times."""
    took = []
    for _ in range(TRIES):
        began = time.perf_counter()
        try:
            with Client(endpoint, timeout=30.0, token=token, curve=curve) as c:
                c.status()
            took.append(time.perf_counter() - began)
        except Exception:  # noqa: BLE001 - a refusal is a result
            took.append(float("inf"))
        time.sleep(0.2)
    return took


def _fmt(xs: list[float]) -> str:
    return "/".join("-" if x == float("inf") else f"{x:.2f}" for x in xs)


def _latencies(ops: list[float], new: list[float]) -> dict[str, Any]:
    met = max(ops) <= OPERATOR_S and max(new) <= NEWCOMER_S
    return {"operator_s": ops, "newcomer_s": new, "slots_met": met}


def idle_hoard(ctx: Ctx) -> dict[str, Any]:
    """4,096 [1,024] request connections finish their handshake and say nothing."""
    n = ctx.n(4096, 1024)
    hoard = _peer("hoard", ctx.d.endpoint, "DEALER", n, ctx.cap_s)
    try:
        time.sleep(IDLE_AFTER + 1.0)
        ops = _operator(ctx.d.endpoint, ctx.d.token)
        new = _ask(ctx.d.endpoint, P.Status())
    finally:
        hoard.kill()
    line = f"{n} idle connections: operator status {_fmt(ops)} s, newcomer {_fmt(new)} s"
    return {"line": line, "connections": n, **_latencies(ops, new)}


def idle_subscribers(ctx: Ctx) -> dict[str, Any]:
    """4,096 [1,024] telemetry connections finish their handshake and subscribe to nothing."""
    n = ctx.n(4096, 1024)
    hoard = _peer("hoard", ctx.d.telemetry, "SUB", n, ctx.cap_s)
    try:
        time.sleep(IDLE_AFTER + 1.0)
        firsts = []
        for _ in range(TRIES):
            began = time.perf_counter()
            try:
                ctx.d.snapshot(timeout=30.0)
                firsts.append(time.perf_counter() - began)
            except Exception:  # noqa: BLE001
                firsts.append(float("inf"))
    finally:
        hoard.kill()
    line = f"{n} idle subscribers: a new subscriber's first snapshot {_fmt(firsts)} s"
    return {"line": line, "connections": n, "newcomer_s": firsts, "slots_met": max(firsts) <= NEWCOMER_S}


def curve_cycle(ctx: Ctx) -> dict[str, Any]:
    """A CURVE daemon of its own; 4,096 [1,024] peers without a key send a greeting and
    nothing more, reopened as soon as closed or after a second."""
    n = ctx.n(4096, 1024)
    with tempfile.TemporaryDirectory(prefix="fsd-abuse-curve-") as tmp:
        keys = generate_keys(Path(tmp) / "keys", clients=1, operators=1)
        creds = CurveKeys(server_public=str(keys["server_public"]),
                          client_secret=str(keys["operator-1_secret"]))  # fmt: skip
        config = (f'[server]\ncurve_secret_key = "{keys["server_secret"]}"\n'
                  f'curve_authorized_dir = "{keys["authorized"]}"\n'
                  f'curve_operators_dir = "{keys["operators"]}"\n')  # fmt: skip
        tree = Path(os.readlink(f"/proc/{ctx.d.proc.pid}/cwd"))  # the tree under test
        d = start_daemon(Path(tmp), config, curve=creds, env={"PYTHONPATH": str(tree)}, cwd=tree)
        try:
            cycler = _peer("cycle", d.endpoint, n, ctx.cap_s)
            try:
                time.sleep(5.0)  # the table fills
                ops = _operator(d.endpoint, None, creds)
            finally:
                cycler.kill()
        finally:
            d.stop(timeout=20)
    line = f"{n} keyless CURVE peers cycling: operator status {_fmt(ops)} s (its own daemon)"
    return {"line": line, "connections": n, "operator_s": ops, "slots_met": max(ops) <= OPERATOR_S}


def _peer_socket(endpoint: str, kind: bytes) -> socket.socket:
    """A raw peer whose handshake is done: libzmq drops a peer whose frames come
    before its own READY went out (the flood would then not be read at all)."""
    host, port = endpoint[len("tcp://") :].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(zmtp.greeting() + zmtp.ready([(b"Socket-Type", kind)]))
    got = b""
    while len(got) < 64 + 2 or len(got) < 64 + 2 + got[65]:  # its greeting and READY
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    return s


def subscription_flood(ctx: Ctx) -> dict[str, Any]:
    """Three telemetry connections each send 200 subscriptions of 60 KB (12 MB), 100 as
    SUBSCRIBE commands and 100 as messages, and stay open 5 s; then they close."""
    topics = [zmtp.frame(b"\x09SUBSCRIBE" + os.urandom(60_000), command=True) for _ in range(100)]
    topics += [zmtp.frame(b"\x01" + os.urandom(60_000)) for _ in range(100)]
    socks, closed = [], 0
    for _ in range(3):
        s = _peer_socket(ctx.d.telemetry, b"SUB")
        try:
            s.sendall(b"".join(topics))
        except OSError:
            closed += 1
        socks.append(s)
    ctx.hold(5.0)
    for s in socks:
        s.close()
    ctx.hold(3.0)
    return {"line": f"3 x 12 MB of subscriptions: {closed} closed while sending", "closed": closed}


def command_flood(ctx: Ctx) -> dict[str, Any]:
    """50 request connections each send 100 SUBSCRIBE commands of 60 KB (300 MB)."""
    command = b"".join(
        zmtp.frame(b"\x09SUBSCRIBE" + os.urandom(60_000), command=True) for _ in range(100)
    )
    closed = 0
    for _ in range(50):
        s = _peer_socket(ctx.d.endpoint, b"DEALER")
        with contextlib.suppress(OSError):
            s.sendall(command)
        closed += _closed(s)
        s.close()
    held = metric(ctx.d, "fsd_inbound_held_bytes")
    return {"line": f"50 x 6 MB of commands: {closed}/50 closed, ledger holds {held:.0f} B",
            "closed": closed, "held": held}  # fmt: skip


def _closed(s: socket.socket) -> bool:
    """Whether the daemon closes `s` within 5 s (what it sent first is read and dropped)."""
    s.settimeout(5)
    try:
        while s.recv(1 << 20):
            pass
    except ConnectionResetError:
        return True
    except OSError:
        return False
    return True


SLOT_CASES = {
    "sub-flood": subscription_flood,
    "cmd-flood": command_flood,
    "idle-hoard": idle_hoard,
    "idle-subs": idle_subscribers,
    "curve-cycle": curve_cycle,
}
