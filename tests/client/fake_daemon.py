"""A fake fsd daemon for SDK tests: a ROUTER (and PUB) thread speaking fsd's protocol.

It is a toy scheduler, not the engine: a job's output repeats its prompt's
characters (token id = ord(char)), one token per job per iteration, and each
iteration sends one `Tokens` message per client carrying the chunks of all that
client's jobs, as the real daemon does. Knobs for the tests:

- `hold`: iterations run only when a test calls `step()` (or, with `chatter`,
  right before each control reply) — deterministic interleavings;
- `chatter`: run one iteration just before answering a control request, so token
  messages and the control reply interleave on the client's socket;
- `mute`: read requests but answer nothing (a hung daemon);
- `reply_delay`: answer control requests that many seconds late;
- `token`: an operator token. Set, a request carrying it has the operator role (its
  `Status` says so) and retune, inject, drain and shutdown without it get an `Error`
  "forbidden", as the real daemon answers; unset, every request may do everything.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

import zmq

from fsd import protocol as P

CONFIG = {
    "policy": "skip-join",
    "quanta": [0.01, 0.02, 0.04],
    "q1": None,
    "starve_limit": None,
    "starve_limit_waiting": None,
    "preempt_threshold": 3,
    "kv_policy": "proactive",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class FakeJob:
    ident: bytes | None  # the client that made it
    req_id: str
    job_id: str
    text: str
    tags: list[str]
    stream: bool = True  # False: injected: no tokens, only its Finished (req_id = job id)
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
        curve: tuple[bytes, bytes] | None = None,  # (public, secret): a CURVE server
        token: str | None = None,
    ):
        self.port = port or free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.telemetry_port = free_port() if telemetry else None
        self.telemetry_endpoint = f"tcp://127.0.0.1:{self.telemetry_port}"
        self.tick = tick
        self.curve = curve
        self.token = token
        self.hold = False
        self.chatter = False
        self.mute = False
        self.reply_delay = 0.0
        self.received: list[tuple[float, P.Request]] = []
        self.jobs: dict[str, FakeJob] = {}
        self.config = dict(CONFIG)
        self.draining = False
        self._ids = 0
        self._steps = 0
        self._later: list[tuple[float, bytes, P.Reply]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- life --------------------------------------------------------------------

    def start(self) -> FakeDaemon:
        ctx = zmq.Context.instance()
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            self._sock.curve_publickey, self._sock.curve_secretkey = self.curve
            self._sock.curve_server = True
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

    def _reply(self, ident: bytes, msg: P.Reply) -> None:
        if self.chatter:
            self._iterate()
        if self.reply_delay:
            self._later.append((time.monotonic() + self.reply_delay, ident, msg))
        else:
            self._send(ident, msg)

    def role(self, msg: P.Request) -> str:
        """The role a request has: "operator" with the token (or when there is none)."""
        return "operator" if self.token is None or msg.token == self.token else "client"

    def _handle(self, ident: bytes, msg: P.Request) -> None:
        self.received.append((time.monotonic(), msg))
        if self.mute or isinstance(msg, P.Ping):
            return
        operator_only = (P.Retune, P.Inject, P.Drain, P.Undrain, P.Shutdown)
        if isinstance(msg, operator_only) and self.role(msg) != "operator":
            what = msg.__struct_config__.tag
            self._reply(ident, P.Error(code="forbidden", message=f"{what} needs the operator role"))
            return
        if isinstance(msg, P.Submit):
            self._submit(ident, msg)
        elif isinstance(msg, P.Abort):
            job = self.jobs.pop(msg.job_id, None)
            if job is None:
                self._reply(ident, P.Error(code="unknown-job", message=f"no job {msg.job_id}"))
                return
            self._reply(ident, P.Ack(what="abort", detail={"job_id": msg.job_id}))
            if job.ident is not None:
                self._send(job.ident, self._finished(job, "abort"))
        elif isinstance(msg, P.Retune):
            bad = [k for k in msg.changes if k not in self.config]
            if bad:
                self._reply(ident, P.Error(code="invalid-setting", message=f"unknown {bad[0]}"))
                return
            self.config.update(msg.changes)
            self._reply(ident, P.Ack(what="retune", detail={"config": dict(self.config)}))
        elif isinstance(msg, P.Inject):
            count = msg.burst.count if msg.burst else 2
            ids = []
            for _ in range(count):
                job = self._new_job(ident, "", "x" * 4, [msg.tag])
                job.req_id, job.stream = job.job_id, False
                ids.append(job.job_id)
            ack = P.Ack(what="inject", detail={"job_ids": ids}, req_id=msg.req_id)
            self._reply(ident, ack)
        elif isinstance(msg, P.ListJobs):
            self._reply(ident, P.JobList(jobs=[_info(j) for j in self.jobs.values()]))
        elif isinstance(msg, P.GetJob):
            job = self.jobs.get(msg.job_id)
            if job is None:
                self._reply(ident, P.Error(code="unknown-job", message=f"no job {msg.job_id}"))
            else:
                self._reply(ident, P.JobReply(job=_info(job)))
        elif isinstance(msg, P.Status):
            status = self.status()
            status.role = self.role(msg)
            self._reply(ident, status)
        elif isinstance(msg, P.Drain):
            self.draining = True
            self._reply(ident, P.Ack(what="drain", detail={"jobs": len(self.jobs)}))
        elif isinstance(msg, P.Undrain):
            self.draining = False
            self._reply(ident, P.Ack(what="undrain", detail={"draining": False}))
        elif isinstance(msg, P.Shutdown):
            self._reply(ident, P.Ack(what="shutdown"))

    def status(self) -> P.StatusReply:
        return P.StatusReply(
            pid=1234, version="0.1.0", model="tiny", policy=self.config["policy"],
            kv_policy="proactive", uptime=1.5, jobs=len(self.jobs), running=len(self.jobs),
            iterations=7, draining=self.draining,
        )  # fmt: skip

    def _submit(self, ident: bytes, msg: P.Submit) -> None:
        prompt = msg.prompt if msg.prompt is not None else "".join(map(chr, msg.prompt_token_ids))
        if self.draining:
            self._reply(ident, P.Error(code="draining", message="draining", req_id=msg.req_id))
        elif len(prompt) > 100:
            self._reply(
                ident,
                P.Error(
                    code="prompt-too-long",
                    message=f"prompt of {len(prompt)} tokens exceeds 100",
                    req_id=msg.req_id,
                ),
            )
        else:
            text = (prompt * msg.sampling.max_tokens)[: msg.sampling.max_tokens]
            job = self._new_job(ident, msg.req_id, text, msg.tags)
            self._send(ident, P.Accepted(req_id=msg.req_id, job_id=job.job_id,
                                         prompt_tokens=len(prompt)))  # fmt: skip

    def _new_job(self, ident: bytes | None, req_id: str, text: str, tags: list[str]) -> FakeJob:
        self._ids += 1
        job = FakeJob(ident, req_id, f"job-{self._ids}", text, list(tags))
        self.jobs[job.job_id] = job
        return job

    def _iterate(self) -> None:
        """One iteration: a token for every job; one Tokens message per client."""
        per_client: dict[bytes, list[P.Chunk]] = {}
        done: list[FakeJob] = []
        for job in list(self.jobs.values()):
            char = job.text[len(job.out)]
            job.out.append(ord(char))
            job.first = job.first or time.time()
            if job.ident is not None and job.stream:
                chunk = P.Chunk(req_id=job.req_id, job_id=job.job_id, token_ids=[ord(char)],
                                text=char)  # fmt: skip
                per_client.setdefault(job.ident, []).append(chunk)
            if len(job.out) == len(job.text):
                done.append(job)
        for ident, chunks in per_client.items():
            self._send(ident, P.Tokens(chunks=chunks))
        for job in done:
            del self.jobs[job.job_id]
            if job.ident is not None:
                self._send(job.ident, self._finished(job, "length"))
        if self._pub is not None:
            for job in done:
                event = P.Event(time=time.time(), kind="finish", job_id=job.job_id)
                self._pub.send_multipart([P.TOPIC_EVENT, P.encode(event)])

    def _finished(self, job: FakeJob, reason: str) -> P.Finished:
        now = time.time()
        timings = P.Timings(arrival=job.arrival, first_token=job.first, finish=now,
                            ttft=(job.first or now) - job.arrival, latency=now - job.arrival)  # fmt: skip
        return P.Finished(
            req_id=job.req_id, job_id=job.job_id, reason=reason,
            text="".join(map(chr, job.out)), token_ids=list(job.out), timings=timings,
            preemptions=1,
        )  # fmt: skip


_seq = 0


def snapshot(n_jobs: int = 0, seq: int | None = None) -> P.Snapshot:
    """A small valid Snapshot."""
    global _seq
    _seq += 1
    kv = P.KVInfo(block_size=16, device_total=64, device_used=8, device_reserved=4,
                  device_free=52, host_total=128, host_used=0, bytes_in_flight=0,
                  swapped_out_bytes=0, swapped_in_bytes=0)  # fmt: skip
    slo = P.SLOInfo(window=60.0, finished=3, avg_per_token_latency=0.01,
                    p95_per_token_latency=0.02, avg_ttft=0.05, p95_ttft=0.1, tokens_per_s=100.0,
                    requests_per_s=2.0, slo_per_token_latency=0.05)  # fmt: skip
    return P.Snapshot(
        time=time.time(), seq=_seq if seq is None else seq, policy="skip-join",
        levels=[P.LevelInfo(index=1, quantum=0.01, job_ids=[]),
                P.LevelInfo(index=2, quantum=0.02, job_ids=[])],
        jobs=[], kv=kv, iterations=[P.IterationInfo(start=0.0, duration=0.01, batch_size=n_jobs,
                                                    prefill_tokens=0, decode_tokens=n_jobs)],
        slo=slo, config=dict(CONFIG),
    )  # fmt: skip


def _info(job: FakeJob) -> P.JobInfo:
    return P.JobInfo(
        job_id=job.job_id, state="running", level=1, kv="device", blocks=1, host_blocks=0,
        enst=0.01, prompt_tokens=len(job.text), output_tokens=len(job.out), waited=0.0,
        attained=0.0, arrival=job.arrival, tags=job.tags,
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
