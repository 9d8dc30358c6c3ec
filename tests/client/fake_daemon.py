"""A fake fsd daemon for timing faults: a ROUTER (and PUB) thread speaking fsd's protocol.

The SDK's happy paths run against the real daemon (`tests.server.daemon_proc`); this
fake is for what a real daemon will not do on cue: answer late, not answer at all,
die with a job in flight and come back, or change its operator token mid-session.
It also records what it received (`requests`), e.g. to count heartbeats.

It serves only what those tests need: `Submit` (a toy job whose output repeats its
prompt's characters, token id = ord(char), one token per iteration, one `Tokens`
message per client per iteration as the real daemon sends), `Ping`, `Status` (its
`iterations` counts the Status requests answered, so a test can tell a late answer
from a fresh one), `Preview` (a canned `PreviewReply`, see `preview_reply`, after
`preview_delay` seconds; an unknown key or a bad horizon / seeds refused at once with
"invalid-setting", a second preview while one is pending with "overloaded", every
`Error` naming the request's req_id as the real daemon's) and, with `telemetry`, a
snapshot every 20 ms. `Abort` is always answered "unknown-job", as the real daemon
answers once a job has left its engine, its end perhaps not sent yet (with `hold`,
that end comes when a test steps). Any other request gets an `Error` "unsupported".
Knobs:

- `hold`: iterations run only when a test calls `step()`: jobs stay outstanding;
- `mute`: read requests but answer nothing (a hung daemon);
- `reply_delay`: answer Status that many seconds late;
- `hold_previews`: previews are answered only once a test sets it back to False;
- `token`: an operator token. Set, a request carrying it has the operator role (its
  `Status` says so) and retune, inject, preview, drain, undrain and shutdown without it
  get an `Error` "forbidden", as the real daemon answers; change it to rotate the token.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field

import zmq

from fsd import protocol as P
from fsd.errors import SettingError
from fsd.protocol_preview import MAX_HORIZON, MAX_SEEDS
from fsd.sched.retune import check_names
from tests.server.daemon_proc import free_port

OPERATOR_ONLY = (P.Retune, P.Inject, P.Drain, P.Undrain, P.Shutdown, P.Preview)


@dataclass
class FakeJob:
    ident: bytes  # the client that made it
    req_id: str
    job_id: str
    text: str
    arrival: float = field(default_factory=time.time)
    out: list[int] = field(default_factory=list)
    first: float | None = None


class FakeDaemon:
    """See the module doc; `received` lists (time, request) in arrival order."""

    def __init__(
        self,
        port: int | None = None,
        tick: float = 0.002,
        telemetry: bool = False,
        token: str | None = None,
    ):
        self.port = port or free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.telemetry_port = free_port() if telemetry else None
        self.telemetry_endpoint = f"tcp://127.0.0.1:{self.telemetry_port}"
        self.tick = tick
        self.token = token
        self.hold = False
        self.mute = False
        self.reply_delay = 0.0
        self.preview_delay = 0.05
        self.hold_previews = False
        self.previews: list[tuple[float, bytes, P.PreviewReply]] = []  # not answered yet
        self.received: list[tuple[float, P.Request]] = []
        self.jobs: dict[str, FakeJob] = {}
        self._ids = 0
        self._statuses = 0
        self._steps = 0
        self._later: list[tuple[float, bytes, P.Reply]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- life --------------------------------------------------------------------

    def start(self) -> FakeDaemon:
        ctx = zmq.Context.instance()
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        _bind(self._sock, self.endpoint)
        self._pub = None
        if self.telemetry_port:
            self._pub = ctx.socket(zmq.PUB)
            self._pub.setsockopt(zmq.LINGER, 0)
            _bind(self._pub, self.telemetry_endpoint)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._thread = None

    def step(self, n: int = 1) -> None:
        """Ask the server thread to run `n` iterations (with `hold` set)."""
        self._steps += n

    def requests(self, kind: type) -> list[P.Request]:
        return [m for _, m in list(self.received) if isinstance(m, kind)]

    # ---- the server thread -------------------------------------------------------

    def _run(self) -> None:
        sock, last, published = self._sock, time.monotonic(), 0.0
        try:
            while not self._stop.is_set():
                if sock.poll(1):
                    ident, frame = sock.recv_multipart()
                    self._handle(ident, P.decode_request(frame))
                now = time.monotonic()
                if self._later and self._later[0][0] <= now:
                    _, ident, msg = self._later.pop(0)
                    self._send(ident, msg)
                if self.previews and not self.hold_previews and self.previews[0][0] <= now:
                    _, ident, reply = self.previews.pop(0)
                    self._send(ident, reply)
                if self.hold:
                    while self._steps > 0:
                        self._steps -= 1
                        self._iterate()
                elif now - last >= self.tick:
                    last = now
                    self._iterate()
                if self._pub is not None and now - published >= 0.02:
                    published = now
                    self._pub.send_multipart([P.TOPIC_SNAPSHOT, P.encode(snapshot(len(self.jobs)))])
        finally:
            sock.close(linger=0)
            if self._pub is not None:
                self._pub.close(linger=0)

    def _send(self, ident: bytes, msg: P.Reply) -> None:
        self._sock.send_multipart([ident, P.encode(msg)])

    def role(self, msg: P.Request) -> str:
        """The role a request has: "operator" with the token (or when there is none)."""
        return "operator" if self.token is None or msg.token == self.token else "client"

    def _handle(self, ident: bytes, msg: P.Request) -> None:
        self.received.append((time.monotonic(), msg))
        what = msg.__struct_config__.tag
        if self.mute or isinstance(msg, P.Ping):
            return
        if isinstance(msg, OPERATOR_ONLY) and self.role(msg) != "operator":
            req_id = msg.req_id if isinstance(msg, P.Preview) else None
            message = f"{what} needs the operator role"
            self._send(ident, P.Error(code="forbidden", message=message, req_id=req_id))
        elif isinstance(msg, P.Hello):  # no resuming here: every connection is new
            self._send(ident, P.Welcome(session=f"fake-{ident.hex()}"))
        elif isinstance(msg, P.Preview):
            self._preview(ident, msg)
        elif isinstance(msg, P.Submit):
            self._submit(ident, msg)
        elif isinstance(msg, P.Abort):
            self._send(ident, P.Error(code="unknown-job", message=f"no job with id {msg.job_id!r}"))
        elif isinstance(msg, P.Status):
            self._statuses += 1
            status = P.StatusReply(
                pid=os.getpid(), version="0.1.0", model="fake", policy="sj-mlfq",
                kv_policy="proactive", uptime=1.5, jobs=len(self.jobs), running=len(self.jobs),
                iterations=self._statuses, draining=False, role=self.role(msg),
            )  # fmt: skip
            if self.reply_delay:
                self._later.append((time.monotonic() + self.reply_delay, ident, status))
            else:
                self._send(ident, status)
        else:
            message = f"the fake daemon does not serve {what} (use the real one)"
            self._send(ident, P.Error(code="unsupported", message=message))

    def _submit(self, ident: bytes, msg: P.Submit) -> None:
        prompt = msg.prompt if msg.prompt is not None else "".join(map(chr, msg.prompt_token_ids))
        text = (prompt * msg.sampling.max_tokens)[: msg.sampling.max_tokens]
        self._ids += 1
        job = FakeJob(ident, msg.req_id, f"job-{self._ids}", text)
        self.jobs[job.job_id] = job
        accepted = P.Accepted(req_id=msg.req_id, job_id=job.job_id, prompt_tokens=len(prompt))
        self._send(ident, accepted)

    def _preview(self, ident: bytes, msg: P.Preview) -> None:
        try:  # the daemon's own words for a name it does not retune
            check_names(msg.changes)
        except SettingError as exc:
            self._send(ident, P.Error(code=exc.code, message=str(exc), req_id=msg.req_id))
            return
        if not 0 < msg.horizon <= MAX_HORIZON:
            refusal = ("invalid-setting", f"horizon must be in (0, {MAX_HORIZON:g}] seconds, got {msg.horizon!r}")  # fmt: skip
        elif not 1 <= msg.seeds <= MAX_SEEDS:
            refusal = ("invalid-setting", f"seeds must be an integer in [1, {MAX_SEEDS}], got {msg.seeds!r}")  # fmt: skip
        elif self.previews:
            refusal = ("overloaded", "a preview is running already; ask again when it ends")
        else:
            reply = preview_reply(msg.changes, msg.horizon, msg.seeds, msg.req_id)
            self.previews.append((time.monotonic() + self.preview_delay, ident, reply))
            return
        self._send(ident, P.Error(code=refusal[0], message=refusal[1], req_id=msg.req_id))

    def _iterate(self) -> None:
        """One iteration: a token for every job; one Tokens message per client."""
        per_client: dict[bytes, list[P.Chunk]] = {}
        done: list[FakeJob] = []
        for job in list(self.jobs.values()):
            char = job.text[len(job.out)]
            job.out.append(ord(char))
            job.first = job.first or time.time()
            chunk = P.Chunk(req_id=job.req_id, job_id=job.job_id, token_ids=[ord(char)], text=char)
            per_client.setdefault(job.ident, []).append(chunk)
            if len(job.out) == len(job.text):
                done.append(job)
        for ident, chunks in per_client.items():
            self._send(ident, P.Tokens(chunks=chunks))
        for job in done:
            del self.jobs[job.job_id]
            self._send(job.ident, _finished(job))


def _finished(job: FakeJob) -> P.Finished:
    now = time.time()
    return P.Finished(
        req_id=job.req_id, job_id=job.job_id, reason="length",
        text="".join(map(chr, job.out)), token_ids=list(job.out),
        timings=P.Timings(arrival=job.arrival, first_token=job.first, finish=now),
    )  # fmt: skip


def preview_reply(
    changes: dict, horizon: float = 60.0, seeds: int = 4, req_id: str | None = None
) -> P.PreviewReply:
    """A canned what-if answer: the proposed side 20% faster, one note."""

    def side(scale: float) -> P.PreviewSide:
        def spread(mean: float) -> P.Spread:
            return P.Spread(mean=mean * scale, lo=mean * scale * 0.9, hi=mean * scale * 1.1)

        return P.PreviewSide(
            avg=spread(0.02), p95=spread(0.05), ttft_p99=spread(1.5), goodput=spread(3.0 / scale**2),
            finished=spread(180 / scale**2), unfinished=spread(12), preemptions=spread(40),
            swaps=spread(6), peak_kv_blocks=spread(400),
        )  # fmt: skip

    assumptions = P.PreviewAssumptions(
        taken_at=time.time(), horizon=horizon, seeds=list(range(seeds)), live_jobs=12,
        sampled_remaining=9,
        arrival_rate=3.2, arrival_cv=1.4, arrival_window=120.0, arrivals_seen=384,
        lengths_from=250, clock_scale=1.05, clock_overhead=0.0004, clock_samples=900,
        slo=0.05, notes=["the fake daemon's canned preview"],
    )  # fmt: skip
    return P.PreviewReply(
        changes=changes, current=side(1.0), proposed=side(0.8), assumptions=assumptions,
        wall_s=0.05, req_id=req_id,
    )  # fmt: skip


_seq = 0


def snapshot(n_jobs: int = 0, seq: int | None = None) -> P.Snapshot:
    """A small valid Snapshot (its `config` a part of the real daemon's)."""
    global _seq
    _seq += 1
    kv = P.KVInfo(block_size=16, device_total=64, device_used=8, device_reserved=4,
                  device_free=52, host_total=128, host_used=0, bytes_in_flight=0,
                  swapped_out_bytes=0, swapped_in_bytes=0)  # fmt: skip
    slo = P.SLOInfo(window=60.0, finished=3, avg_per_token_latency=0.01,
                    p95_per_token_latency=0.02, avg_ttft=0.05, p95_ttft=0.1, tokens_per_s=100.0,
                    requests_per_s=2.0, slo_per_token_latency=0.05)  # fmt: skip
    config = {"sched": {"policy": "sj-mlfq", "quanta": None, "quantum_ratio": 2.0},
              "cache": {"kv_policy": "proactive"}}  # fmt: skip
    return P.Snapshot(
        time=time.time(), seq=_seq if seq is None else seq, policy="sj-mlfq",
        levels=[P.LevelInfo(index=1, quantum=0.01, job_ids=[]),
                P.LevelInfo(index=2, quantum=0.02, job_ids=[])],
        jobs=[], kv=kv, iterations=[P.IterationInfo(start=0.0, duration=0.01, batch_size=n_jobs,
                                                    prefill_tokens=0, decode_tokens=n_jobs)],
        slo=slo, config=config,
    )  # fmt: skip


def _bind(sock: zmq.Socket, endpoint: str) -> None:
    """Bind, retrying briefly: a port closed a moment ago may still be held."""
    deadline = time.monotonic() + 5
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextlib.contextmanager
def running(**kwargs: object):
    daemon = FakeDaemon(**kwargs).start()  # type: ignore[arg-type]
    try:
        yield daemon
    finally:
        daemon.stop()
