"""The daemon's heartbeat: requests in, one engine iteration, tokens and telemetry out.

One thread owns the engine and the ROUTER socket, so nothing about the scheduler
needs locking; it polls the socket without blocking while there is work and blocks
on it when there is none (no busy loop). Telemetry is read here and sent from the
publisher's thread. Bad input of any kind is answered with an `Error` and the loop
goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

import zmq

from fsd import __version__
from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.engine.core import Engine
from fsd.engine.output import RequestOutput, StepDelta
from fsd.errors import ConfigError, FsdError, PromptTooLongError, UnknownJobError
from fsd.jobs import JobStatus
from fsd.metrics import Finish, SLOWindow
from fsd.sched.registry import SLO_DECODE_STEPS
from fsd.server.control import ControlHandler
from fsd.server.security import Security
from fsd.server.telemetry import JobTablePacer, Publisher, build_snapshot, wire_event

log = logging.getLogger("fsd.server")

_MAX_MESSAGES_PER_TURN = 1000  # then run an iteration, so a flood cannot starve the engine
_EVENT_FLUSH_S = 0.05  # longest an event waits before it is published
_HARD_FRAME_LIMIT = 64 * 1024 * 1024  # zmq drops bigger frames outright (memory guard)


@dataclass
class ClientState:
    """A connected client: when it last spoke and which of its jobs are live."""

    last_seen: float
    jobs: dict[str, str] = field(default_factory=dict)  # job_id -> req_id


class EngineService:
    """Serves one engine on a ROUTER (requests) and a PUB (telemetry) socket."""

    def __init__(self, engine: Engine, cfg: ServerConfig) -> None:
        self.engine = engine
        self.cfg = cfg
        self.ctx = zmq.Context()
        self.security = Security(self.ctx, cfg)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.SNDHWM, 100_000)
        self.router.setsockopt(zmq.RCVHWM, 100_000)
        self.router.setsockopt(zmq.MAXMSGSIZE, max(_HARD_FRAME_LIMIT, cfg.max_frame_bytes))
        configure = self.security.configure()
        if configure is not None:
            configure(self.router)
        self.router.bind(cfg.endpoint)
        self.publisher = Publisher(self.ctx, cfg.telemetry_endpoint, configure)
        engine.events.enabled = True
        self.clients: dict[bytes, ClientState] = {}
        self.owners: dict[str, tuple[bytes, str]] = {}  # job_id -> (client, req_id)
        slo = SLO_DECODE_STEPS * engine.cost.min_iteration_time
        self.slo = SLOWindow(cfg.slo_window, slo)
        self.control = ControlHandler(self)
        self.started = time.time()
        self.draining = False
        self.stopping = False
        self.stop_deadline: float | None = None
        self.drain_waiters: list[tuple[bytes, float]] = []  # (client, deadline)
        self.degraded: str | None = None
        self._snap_seq = 0
        self._next_snapshot = 0.0
        self.telemetry_enabled = cfg.telemetry_hz > 0
        self._job_pacer = JobTablePacer(cfg.telemetry_job_budget)
        self._events: list = []  # engine events not yet handed to the publisher
        self._next_events = 0.0
        # engine-thread seconds in model steps and in telemetry (what telemetry costs)
        self.step_seconds = 0.0
        self.telemetry_seconds = 0.0
        self.http = None  # the OpenAI-compatible API and /metrics (fsd.server.http_server)
        if cfg.http is not None:
            from fsd.server.http_server import HttpFrontend

            self.http = HttpFrontend(self)
            self.http.start()

    # ---- the loop ------------------------------------------------------------------

    def run(self) -> None:
        """Serve until a shutdown completes."""
        log.info(
            "serving %s on %s (telemetry %s)",
            self.engine.loaded.source,
            self.cfg.endpoint,
            self.cfg.telemetry_endpoint,
        )
        try:
            while not self._finished_stopping():
                self.control.scenarios.pump(time.time())  # injected scenarios' due jobs
                busy = self.engine.has_unfinished()
                self._receive(block=not busy)
                self._reap_silent_clients()
                if self.engine.has_unfinished():
                    t0 = time.perf_counter()
                    self._route(self.engine.step())
                    self.step_seconds += time.perf_counter() - t0
                t0 = time.perf_counter()
                self._telemetry()
                self.telemetry_seconds += time.perf_counter() - t0
                self._answer_drain_waiters()
        finally:
            self.close()

    def _receive(self, block: bool) -> None:
        timeout = 0
        if block:
            timeout = 200
            if self.telemetry_enabled:
                wake = self._next_snapshot
                if self._events:  # events waiting for their batch to go out
                    wake = min(wake, self._next_events)
                timeout = int(max(0.0, min(0.2, wake - time.time())) * 1000)
            due = self.control.scenarios.next_due()
            if due is not None:  # wake for a scenario's next arrival, not 200 ms late
                timeout = min(timeout, int(max(0.0, due - time.time()) * 1000))
        if not self.router.poll(timeout):
            return
        for _ in range(_MAX_MESSAGES_PER_TURN):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            self._handle(frames)

    def _handle(self, frames: list[bytes]) -> None:
        ident = frames[0]
        client = self.clients.setdefault(ident, ClientState(time.time()))
        client.last_seen = time.time()
        if len(frames) != 2:
            self.send(
                ident, P.Error(code="malformed", message=f"expected 1 frame, got {len(frames) - 1}")
            )
            return
        payload = frames[1]
        if len(payload) > self.cfg.max_frame_bytes:
            self.send(
                ident,
                P.Error(
                    code="too-large",
                    message=(
                        f"frame of {len(payload)} bytes exceeds max_frame_bytes {self.cfg.max_frame_bytes}"
                    ),
                ),
            )
            return
        try:
            msg = P.decode_request(payload)
        except P.ProtocolError as exc:
            self.send(ident, P.Error(code=exc.code, message=str(exc)))
            return
        try:
            self.control.dispatch(ident, msg)
        except FsdError as exc:  # every deliberate refusal lands here
            self.send(
                ident,
                P.Error(
                    code=error_code(exc), message=str(exc), req_id=getattr(msg, "req_id", None)
                ),
            )
        except Exception as exc:  # noqa: BLE001 - bad input must never kill the daemon
            log.exception("request %s failed", type(msg).__name__)
            self.send(
                ident,
                P.Error(
                    code="internal",
                    message=f"{type(exc).__name__}: {exc}",
                    req_id=getattr(msg, "req_id", None),
                ),
            )

    def send(self, ident: bytes | None, msg: P.Reply) -> None:
        if ident is None:
            return
        try:
            self.router.send_multipart([ident, P.encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # a vanished peer or a full queue loses only its message
            log.debug("dropped a reply to %r: %s", ident, exc)

    # ---- jobs ----------------------------------------------------------------------

    def own(self, job_id: str, ident: bytes | None, req_id: str) -> None:
        if ident is None:
            return
        self.owners[job_id] = (ident, req_id)
        self.clients[ident].jobs[job_id] = req_id

    def finished(self, out: RequestOutput) -> None:
        """Record a job's end and tell its client."""
        if out.per_token_latency is not None and out.ttft is not None:
            self.slo.add(
                Finish(
                    out.finish_time or time.time(),
                    out.per_token_latency,
                    out.ttft,
                    len(out.token_ids),
                )
            )
        if self.http is not None:
            self.http.job_finished(out)  # a queue put: /metrics histograms
        owner = self.owners.pop(out.request_id, None)
        if owner is None:
            return
        ident, req_id = owner
        client = self.clients.get(ident)
        if client is not None:
            client.jobs.pop(out.request_id, None)
        self.send(ident, finished_message(out, req_id))

    def _route(self, deltas: list[StepDelta]) -> None:
        per_client: dict[bytes, list[P.Chunk]] = defaultdict(list)
        for d in deltas:
            owner = self.owners.get(d.job_id)
            if owner is not None:
                per_client[owner[0]].append(
                    P.Chunk(
                        req_id=owner[1],
                        job_id=d.job_id,
                        token_ids=list(d.new_token_ids),
                        text=d.new_text,
                    )
                )
        for ident, chunks in per_client.items():
            self.send(ident, P.Tokens(chunks=chunks))
        for d in deltas:
            if d.output is not None:
                self.finished(d.output)

    def _reap_silent_clients(self) -> None:
        """Abort the jobs of clients that stopped talking (no heartbeat)."""
        limit = time.time() - self.cfg.client_timeout
        for ident, client in list(self.clients.items()):
            if client.last_seen >= limit:
                continue
            for job_id in list(client.jobs):
                log.info("client %r went silent: aborting %s", ident, job_id)
                with contextlib.suppress(UnknownJobError):  # if alive after all, it hears
                    self.finished(self.engine.abort(job_id))
            del self.clients[ident]

    # ---- drain and shutdown --------------------------------------------------------

    def begin_drain(self, ident: bytes | None, timeout: float) -> None:
        self.draining = True
        if ident is not None:
            self.drain_waiters.append((ident, time.time() + timeout))

    def begin_shutdown(self, drain: bool, timeout: float) -> None:
        self.draining = True
        self.stopping = True
        self.stop_deadline = time.time() + (timeout if drain else 0.0)

    def _answer_drain_waiters(self) -> None:
        if not self.drain_waiters:
            return
        now = time.time()
        empty = not self.engine.has_unfinished()
        keep = []
        for ident, deadline in self.drain_waiters:
            if empty or now >= deadline:
                self.send(
                    ident,
                    P.Ack(
                        what="drain",
                        detail={"drained": empty, "remaining": len(self.engine.scheduler)},
                    ),
                )
            else:
                keep.append((ident, deadline))
        self.drain_waiters = keep

    def _finished_stopping(self) -> bool:
        if not self.stopping:
            return False
        if self.engine.has_unfinished() and time.time() < (self.stop_deadline or 0.0):
            return False
        for job in list(self.engine.scheduler.jobs()):  # the drain ran out of time
            if job.status is not JobStatus.FINISHED:
                self.finished(self.engine.abort(job.job_id))
        return True

    # ---- telemetry -----------------------------------------------------------------

    def _telemetry(self) -> None:
        events = self.engine.events.drain()
        now = time.time()
        if self.telemetry_enabled:
            # events go out in batches at most every 50 ms: each hand-off to the
            # publisher thread costs the engine thread GIL time, more than the events
            self._events.extend(events)
            if self._events and (now >= self._next_events or len(self._events) >= 512):
                self.publisher.publish_all(P.TOPIC_EVENT, self._events, wire_event)
                self._events = []
                self._next_events = now + _EVENT_FLUSH_S
        if self.telemetry_enabled and now >= self._next_snapshot:
            self._snap_seq += 1
            with_jobs = self._job_pacer.due(now)
            snap = build_snapshot(self.engine, self.slo, self._snap_seq, now, with_jobs)
            if with_jobs:
                self._job_pacer.sent(now, time.time() - now)
            self.publisher.publish(P.TOPIC_SNAPSHOT, snap)
            self._next_snapshot = now + 1.0 / self.cfg.telemetry_hz

    def status(self) -> P.StatusReply:
        sched = self.engine.scheduler
        return P.StatusReply(
            pid=os.getpid(),
            version=__version__,
            model=self.engine.loaded.source,
            policy=sched.name,
            kv_policy=self.engine.config.cache.kv_policy,
            uptime=time.time() - self.started,
            jobs=len(sched),
            running=sum(1 for j in sched.jobs() if j.status is JobStatus.RUNNING),
            iterations=self.engine.iterations,
            draining=self.draining,
            degraded=self.degraded or self.engine.degraded,
            client_timeout=self.cfg.client_timeout,
            step_seconds=self.step_seconds,
            telemetry_seconds=self.telemetry_seconds,
        )

    def close(self) -> None:
        if self.http is not None:  # its socket must close before the context terminates
            self.http.stop()
        if self._events:
            self.publisher.publish_all(P.TOPIC_EVENT, self._events, wire_event)
        self.publisher.close()
        self.router.close(linger=0)
        self.security.close()
        self.engine.close()
        self.ctx.term()


def finished_message(out: RequestOutput, req_id: str) -> P.Finished:
    return P.Finished(
        req_id=req_id,
        job_id=out.request_id,
        reason=out.finish_reason or "abort",
        text=out.text,
        token_ids=out.token_ids,
        timings=P.Timings(
            arrival=out.arrival_time,
            first_token=out.first_token_time,
            finish=out.finish_time,
            ttft=out.ttft,
            latency=out.latency,
            per_token_latency=out.per_token_latency,
            token_times=out.token_times,
        ),
        preemptions=out.preemptions,
        swaps_out=out.swaps_out,
        swaps_in=out.swaps_in,
        recomputes=out.recomputes,
    )


def error_code(exc: FsdError) -> str:
    """A stable code for each kind of refusal."""
    if isinstance(exc, PromptTooLongError):
        return "prompt-too-long"
    if isinstance(exc, UnknownJobError):
        return "unknown-job"
    if isinstance(exc, ConfigError):
        return "invalid"
    return "refused"
