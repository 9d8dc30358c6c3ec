"""The identity fuzzer: peers that choose, reuse and collide routing ids against a live
daemon while honest SDK clients run jobs beside them.

Shared by tests/server/test_identity_fuzz.py (a bounded run in CI) and
bench/fuzz_zmq.py (`--identity-ops 10000 --sockets 500`). Each operation picks one of
`sockets` slots and connects it (under an id drawn to collide: libzmq's next
made-up ids, another slot's id, a closed slot's id, the empty id, random bytes),
closes it, or sends it a Hello (none, a guessed or another slot's secret), a
Ping, a Status, a small Submit, an Abort of anyone's job, or a request carrying
another slot's secret; or it opens a raw connection that hoards a slot (a handshake,
then nothing) or sends subscriptions (SUBSCRIBE and CANCEL commands of up to 60 KB
to the request endpoint, or random topics to the telemetry endpoint). Found: a slot that hears a job that neither it nor a holder of
a secret it held (told in a Welcome or presented in a Hello) submitted, a dead
daemon, or an honest job that did not end with all its tokens.
"""

from __future__ import annotations

import contextlib
import random
import resource
import socket
import struct
import threading
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import zmq

from fsd import protocol as P
from fsd.client import Client
from fsd.server.transport import zmtp

LIBZMQ_FIRST_ID = 0x6B8B4567
HONEST_TOKENS = 12


@dataclass
class Slot:
    """One attacking socket incarnation: its id, what it submitted, the secrets it held."""

    sock: zmq.Socket | None = None
    rid: bytes = b""
    req_ids: set[str] = field(default_factory=set)
    session: str | None = None
    secrets: set[str] = field(default_factory=set)


@dataclass
class IdentityStats:
    ops: int = 0
    connects: int = 0
    closes: int = 0
    replies: int = 0
    leaks: list[str] = field(default_factory=list)
    honest_jobs: int = 0
    honest_bad: list[str] = field(default_factory=list)
    by_op: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Every count, the first 20 leaks and honest jobs cut short, how many leaked."""
        first = {"leaks": self.leaks[:20], "honest_bad": self.honest_bad[:20]}
        return asdict(self) | first | {"leak_count": len(self.leaks)}


class IdentityFuzzer:
    """Runs `ops` operations over `sockets` slots against the daemon at `endpoint`."""

    def __init__(
        self,
        endpoint: str,
        sockets: int,
        seed: int,
        token: str | None,
        telemetry: str | None = None,
    ) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.endpoint = endpoint
        self.telemetry = telemetry
        self.raw: list[socket.socket] = []  # hoarding and subscribing connections
        self.rng = random.Random(seed)
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, sockets * 2 + 64)
        self.slots = [Slot() for _ in range(sockets)]
        self.closed_ids: list[bytes] = []
        self.job_ids: list[str] = []
        self.submitters: dict[str, set[str]] = {}  # req_id -> its submitter's secrets
        self.stats = IdentityStats()
        self.token = token
        self._count = 0
        self._stop = threading.Event()
        self.pace_ms = 5

    # ---- the attacker ----------------------------------------------------------------

    def _pick_id(self) -> bytes:
        r = self.rng.random()
        if r < 0.35:
            return b"\x00" + struct.pack(
                ">I", LIBZMQ_FIRST_ID + self.rng.randrange(len(self.slots))
            )
        if r < 0.5 and self.closed_ids:
            return self.rng.choice(self.closed_ids)
        if r < 0.65:
            other = self.rng.choice(self.slots)
            if other.rid:
                return other.rid
        if r < 0.75:
            return b""
        return self.rng.randbytes(self.rng.randint(1, 32))

    def _connect(self, slot: Slot) -> None:
        self._close(slot)
        slot.rid = self._pick_id()
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if slot.rid:
            s.setsockopt(zmq.ROUTING_ID, slot.rid)
        s.connect(self.endpoint)
        slot.sock, slot.req_ids, slot.session, slot.secrets = s, set(), None, set()
        self.stats.connects += 1

    def _close(self, slot: Slot) -> None:
        if slot.sock is not None:
            self._drain(slot)
            slot.sock.close(linger=0)
            slot.sock = None
            if slot.rid:
                self.closed_ids.append(slot.rid)
                self.closed_ids = self.closed_ids[-200:]
            self.stats.closes += 1

    def _drain(self, slot: Slot) -> None:
        assert slot.sock is not None
        while True:
            try:
                frame = slot.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.stats.replies += 1
            self._check(slot, P.decode_reply(frame))

    def _may_hear(self, slot: Slot, req_id: str) -> bool:
        """Its own job, or one submitted by a connection that shared a secret with it
        (a session moves with its secret, jobs and all)."""
        return req_id in slot.req_ids or bool(self.submitters.get(req_id, set()) & slot.secrets)

    def _check(self, slot: Slot, msg: P.Reply) -> None:
        names: list[str] = []
        if isinstance(msg, P.Tokens):
            names = [c.req_id for c in msg.chunks]
        elif isinstance(msg, P.Finished | P.Accepted):
            names = [msg.req_id]
        elif isinstance(msg, P.Welcome):
            slot.session = msg.session
            slot.secrets.add(msg.session)
            foreign = [j for j in msg.jobs if not self._may_hear(slot, j)]
            if foreign:
                self.stats.leaks.append(f"{slot.rid!r} resumed jobs {foreign[:3]}")
        for name in names:
            if not self._may_hear(slot, name):
                self.stats.leaks.append(f"{slot.rid!r} heard {type(msg).__name__} of {name}")
        if isinstance(msg, P.Accepted):
            self.job_ids.append(msg.job_id)
            self.job_ids = self.job_ids[-500:]

    def _send(self, slot: Slot, msg: P.Request) -> None:
        assert slot.sock is not None
        with contextlib.suppress(zmq.Again):
            slot.sock.send(P.encode(msg), zmq.NOBLOCK)

    def step(self) -> None:
        slot = self.rng.choice(self.slots)
        if slot.sock is None or self.rng.random() < 0.15:
            op = "connect"
            self._connect(slot)
        else:
            op = self.rng.choice(
                [
                    "close",
                    "hello",
                    "hello-other",
                    "ping",
                    "status",
                    "submit",
                    "abort",
                    "other-session",
                    "drain",
                    "hoard",
                    "subscribe",
                    "subscribe-telemetry",
                ]
            )
            self._op(slot, op)
        self.stats.ops += 1
        self.stats.by_op[op] = self.stats.by_op.get(op, 0) + 1

    def _op(self, slot: Slot, op: str) -> None:
        other = self.rng.choice(self.slots)
        if op == "close":
            self._close(slot)
        elif op == "hello":
            guess = self.rng.choice([None, "guess-" + self.rng.randbytes(8).hex(), slot.session])
            self._send(slot, P.Hello(session=guess))
        elif op == "hello-other":  # a secret another connection holds (an insider's leak)
            self._send(slot, P.Hello(session=other.session))
            if other.session is not None:
                slot.secrets.add(other.session)  # it holds the secret: that session is its
        elif op == "ping":
            self._send(slot, P.Ping())
        elif op == "status":
            self._send(slot, P.Status())
        elif op == "submit":
            self._count += 1
            req_id = f"f{self._count}"
            slot.req_ids.add(req_id)
            self.submitters[req_id] = slot.secrets  # the live set: secrets it takes later too
            sampling = P.Sampling(max_tokens=self.rng.randint(1, 6), ignore_eos=True)
            self._send(slot, P.Submit(req_id=req_id, prompt_token_ids=[1, 2, 3], sampling=sampling))
        elif op == "abort" and self.job_ids:
            self._send(slot, P.Abort(job_id=self.rng.choice(self.job_ids)))
        elif op == "other-session":
            self._send(slot, P.Status(session=other.session or "x"))
        elif op in ("hoard", "subscribe", "subscribe-telemetry"):
            self._raw(op)
        if slot.sock is not None:
            slot.sock.poll(self.pace_ms)  # give the daemon a moment to answer
            self._drain(slot)

    def _raw(self, op: str) -> None:
        """A raw connection that hoards a slot or sends subscriptions (module doc)."""
        telemetry = op == "subscribe-telemetry"
        endpoint = self.telemetry if telemetry else self.endpoint
        if endpoint is None:
            return
        parts = urlsplit(endpoint)
        try:
            s = socket.create_connection((parts.hostname, parts.port), timeout=5)
            s.setblocking(False)
            kind = b"SUB" if telemetry else b"DEALER"
            s.send(zmtp.greeting() + zmtp.ready([(b"Socket-Type", kind)]))
        except OSError:
            return
        if op != "hoard":
            topics = []
            for _ in range(self.rng.randint(1, 8)):
                topic = self.rng.randbytes(self.rng.choice([0, 3, 8, 300, 60_000]))
                name = self.rng.choice([b"\x09SUBSCRIBE", b"\x06CANCEL"])
                if telemetry and self.rng.random() < 0.5:
                    topics.append(zmtp.frame(self.rng.choice([b"\x01", b"\x00"]) + topic))
                else:
                    topics.append(zmtp.frame(name + topic, command=True))
            with contextlib.suppress(OSError):  # (closed, or its buffer full: enough)
                s.send(b"".join(topics))
        self.raw.append(s)
        if len(self.raw) > len(self.slots):
            self.raw.pop(0).close()

    def close(self) -> None:
        for s in self.raw:
            s.close()
        for slot in self.slots:
            self._close(slot)
        self.ctx.destroy(linger=0)

    # ---- the honest clients ------------------------------------------------------------

    def honest(self, index: int) -> None:
        """Submit jobs until stopped; each must end with all its tokens."""
        with Client(self.endpoint, timeout=30, token=self.token) as c:
            n = 0
            while not self._stop.is_set():
                n += 1
                prompt = [index + 1, n % 200 + 1, 7]
                try:
                    done = c.complete(prompt, max_tokens=HONEST_TOKENS, ignore_eos=True)
                except Exception as exc:  # noqa: BLE001 - any failure is a finding
                    self.stats.honest_bad.append(f"honest {index}: {type(exc).__name__}: {exc}")
                    continue
                self.stats.honest_jobs += 1
                if done.finish_reason != "length" or len(done.token_ids) != HONEST_TOKENS:
                    self.stats.honest_bad.append(
                        f"honest {index}: {done.finish_reason}, {len(done.token_ids)} tokens"
                    )

    def run(self, ops: int, honest: int = 3) -> IdentityStats:
        threads = [threading.Thread(target=self.honest, args=(i,)) for i in range(honest)]
        for t in threads:
            t.start()
        try:
            for _ in range(ops):
                self.step()
        finally:
            self._stop.set()
            for t in threads:
                t.join(120)
            self.close()
        return self.stats
