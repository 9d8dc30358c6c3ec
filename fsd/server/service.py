"""The daemon's heartbeat: requests in, one engine iteration, tokens and telemetry out.

One thread owns the engine and the ROUTER socket, so nothing about the scheduler
needs locking; it polls the socket without blocking while there is work and blocks
on it when there is none (no busy loop). Telemetry is read here and sent from the
publisher's thread.

Nothing a client sends may end the loop: a frame that does not decode, a request
that fails, a job whose step fails (the engine fails that job alone) and any bug in
the loop's other duties are answered or logged, and the loop goes on. Each request
is checked against the sender's role (`fsd.server.roles`) and the job caps first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from fsd import __version__
from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.engine.core import Engine
from fsd.engine.output import RequestOutput, StepDelta
from fsd.errors import (
    ConfigError,
    ForbiddenError,
    FsdError,
    OverloadedError,
    PromptTooLongError,
    UnknownJobError,
)
from fsd.jobs import JobStatus
from fsd.metrics import Finish, SLOWindow
from fsd.sched.registry import SLO_DECODE_STEPS
from fsd.server.control import ControlHandler
from fsd.server.roles import Authorizer, Caller
from fsd.server.security import Security
from fsd.server.telemetry import JobTablePacer, Publisher, build_snapshot, wire_event

log = logging.getLogger("fsd.server")

_MAX_MESSAGES_PER_TURN = 1000  # then run an iteration, so a flood cannot starve the engine
_EVENT_FLUSH_S = 0.05  # longest an event waits before it is published
# ZeroMQ drops a bigger frame and the peer's connection without a word (a memory
# guard); frames between max_frame_bytes and this still get an `Error` "too-large"
_FRAME_SLACK = 1024 * 1024
_MAX_ERROR_CHARS = 2000  # an Error never echoes more of a client's input than this


@dataclass
class ClientState:
    """A connected client: when it last spoke and which of its jobs are live."""

    last_seen: float
    user_id: str | None = None  # its CURVE key (z85), None on plain loopback
    jobs: dict[str, str] = field(default_factory=dict)  # job_id -> req_id
    req_ids: set[str] = field(default_factory=set)  # the req_ids of `jobs`

    def add(self, job_id: str, req_id: str) -> None:
        self.jobs[job_id] = req_id
        self.req_ids.add(req_id)

    def remove(self, job_id: str) -> None:
        req_id = self.jobs.pop(job_id, None)
        if req_id is not None:
            self.req_ids.discard(req_id)


@dataclass(frozen=True)
class Owner:
    """Whose a job is and how it is answered: streamed tokens, or only its `Finished`."""

    caller: Caller
    req_id: str
    stream: bool = True


class _Once:
    """Logs each distinct failure once with its traceback, then only counts it."""

    def __init__(self, limit: int = 200) -> None:
        self.seen: dict[str, int] = {}
        self.limit = limit

    def exception(self, what: str, exc: BaseException) -> None:
        key = f"{what}: {type(exc).__name__}: {str(exc)[:200]}"
        count = self.seen.get(key, 0)
        if count == 0 and len(self.seen) < self.limit:
            log.error("%s", key, exc_info=exc)
        elif count in (10, 100, 1000, 10000):
            log.error("%s (%d times so far)", key, count)
        self.seen[key] = count + 1


class EngineService:
    """Serves one engine on a ROUTER (requests) and a PUB (telemetry) socket."""

    def __init__(self, engine: Engine, cfg: ServerConfig) -> None:
        """Bind the sockets (and the HTTP port); ConfigError naming the address if one
        cannot be bound, with everything opened so far closed again."""
        self.engine = engine
        self.cfg = cfg
        engine.events.enabled = True
        self._once = _Once()
        self.clients: dict[bytes, ClientState] = {}
        self.owners: dict[str, Owner] = {}
        slo = SLO_DECODE_STEPS * engine.cost.min_iteration_time
        self.slo = SLOWindow(cfg.slo_window, slo)
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
        self.ctx = zmq.Context()
        self.security: Security | None = None
        self._binding = cfg.endpoint
        try:
            self._open(cfg)
        except BaseException as exc:
            self._abandon()
            if isinstance(exc, zmq.ZMQError):
                raise ConfigError(
                    f"cannot bind {self._binding}: {exc.strerror} (another fsd daemon or "
                    "program listens there?)"
                ) from None
            raise

    def _open(self, cfg: ServerConfig) -> None:
        self.security = Security(self.ctx, cfg)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.SNDHWM, 100_000)
        self.router.setsockopt(zmq.RCVHWM, 100_000)
        self.router.setsockopt(zmq.MAXMSGSIZE, cfg.max_frame_bytes + _FRAME_SLACK)
        configure = self.security.configure()
        if configure is not None:
            configure(self.router)
        self.router.bind(cfg.endpoint)
        self._binding = cfg.telemetry_endpoint
        self.publisher = Publisher(self.ctx, cfg.telemetry_endpoint, configure)
        # after binding: a daemon that cannot bind must not replace a running one's token
        self.auth = Authorizer(cfg, self.security.operator_keys)
        self.control = ControlHandler(self)
        if cfg.http is not None:
            from fsd.server.http_server import HttpFrontend

            self._binding = f"http://{cfg.http}"
            self.http = HttpFrontend(self)
            self.http.start()

    def _abandon(self) -> None:
        """Close whatever `_open` opened before it failed."""
        with contextlib.suppress(Exception):
            if self.http is not None:
                self.http.stop()
        if getattr(self, "auth", None) is not None:
            self.auth.close()
        if getattr(self, "publisher", None) is not None:
            with contextlib.suppress(Exception):
                self.publisher.close()
        if self.security is not None:
            self.security.close()
        self.ctx.destroy(linger=0)

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
            while not self._guarded("stopping", self._finished_stopping):
                self._guarded("scenarios", self.control.scenarios.pump, time.time())
                busy = self.engine.has_unfinished()
                self._guarded("receiving", self._receive, not busy)
                self._guarded("reaping", self._reap_silent_clients)
                if self.engine.has_unfinished():
                    t0 = time.perf_counter()
                    self._step()
                    self.step_seconds += time.perf_counter() - t0
                t0 = time.perf_counter()
                self._guarded("telemetry", self._telemetry)
                self.telemetry_seconds += time.perf_counter() - t0
                self._guarded("drain", self._answer_drain_waiters)
        finally:
            self.close()

    def _guarded(self, what: str, duty: Callable[..., Any], *args: Any) -> Any:
        """Run one of the loop's duties; a failure is logged (once) and the loop goes on
        (the duty's answer is then None)."""
        try:
            return duty(*args)
        except Exception as exc:  # noqa: BLE001 - one duty's bug must not stop serving
            self._once.exception(f"the loop's {what} failed", exc)
            return None

    def _step(self) -> None:
        """One engine iteration; the engine fails a faulty job alone, never raising. If
        it raises anyway (a bug), its jobs fail rather than the daemon."""
        try:
            deltas = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - last resort
            self._once.exception("an engine step failed; its jobs are failed", exc)
            deltas = self.engine.fail_all(f"internal error: {type(exc).__name__}: {exc}")
        self._guarded("routing tokens", self._route, deltas)

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
        curve = self.security.enabled  # frames carry the sender's key (User-Id)
        for _ in range(_MAX_MESSAGES_PER_TURN):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=not curve)
            except zmq.Again:
                return
            self._handle(frames)

    def _handle(self, frames: list) -> None:  # bytes, or zmq.Frame with CURVE
        """Answer one client message; nothing it holds may raise out of here."""
        ident = bytes(frames[0])
        try:
            self._handle_frames(ident, frames)
        except Exception as exc:  # noqa: BLE001 - bad input must never kill the daemon
            self._once.exception("handling a request failed", exc)
            self.send(ident, P.Error(code="internal", message=f"{type(exc).__name__}: {exc}"))

    def _handle_frames(self, ident: bytes, frames: list) -> None:
        now = time.time()
        client = self.clients.get(ident)
        if client is None:
            user_id = None
            if isinstance(frames[-1], zmq.Frame):
                user_id = frames[-1].get("User-Id") or None
            client = self.clients[ident] = ClientState(now, user_id)
        client.last_seen = now
        if len(frames) != 2:
            self.send(
                ident, P.Error(code="malformed", message=f"expected 1 frame, got {len(frames) - 1}")
            )
            return
        payload = frames[1] if isinstance(frames[1], bytes) else frames[1].bytes
        if len(payload) > self.cfg.max_frame_bytes:
            self.send(
                ident,
                P.Error(
                    code="too-large",
                    message=f"frame of {len(payload)} bytes exceeds max_frame_bytes "
                    f"{self.cfg.max_frame_bytes}",
                ),
            )
            return
        try:
            msg = P.decode_request(payload)
        except P.ProtocolError as exc:
            self.send(ident, P.Error(code=exc.code, message=str(exc)))
            return
        caller = Caller(ident, self.auth.role(msg, client.user_id), client.user_id)
        try:
            self.auth.check(msg, caller.role)
            self.control.dispatch(caller, msg)
        except Exception as exc:  # noqa: BLE001 - FsdError is a refusal; others are bugs
            if not isinstance(exc, FsdError):  # a TypeError is answered "invalid", but logged
                self._once.exception(f"request {type(msg).__name__} failed", exc)
            self.send_error(ident, exc, getattr(msg, "req_id", None))

    def send(self, ident: bytes | None, msg: P.Reply) -> None:
        if ident is None:
            return
        try:
            self.router.send_multipart([ident, P.encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # a vanished peer or a full queue loses only its message
            log.debug("dropped a reply to %r: %s", ident, exc)

    def send_error(self, ident: bytes, exc: BaseException, req_id: str | None = None) -> None:
        """An `Error` for a refusal (stable code) or a failure (code "internal")."""
        if isinstance(exc, FsdError):
            code, text = error_code(exc), str(exc)
        elif isinstance(exc, TypeError):  # a wrong type deep in a request's values
            code, text = "invalid", str(exc)
        else:
            code, text = "internal", f"{type(exc).__name__}: {exc}"
        if len(text) > _MAX_ERROR_CHARS:
            text = text[:_MAX_ERROR_CHARS] + "..."
        self.send(ident, P.Error(code=code, message=text, req_id=req_id))

    # ---- jobs ----------------------------------------------------------------------

    def own(self, job_id: str, caller: Caller, req_id: str, stream: bool = True) -> None:
        """`job_id` is `caller`'s: streamed to it (or only finished), reaped with it."""
        self.owners[job_id] = Owner(caller, req_id, stream)
        client = self.clients.get(caller.ident)
        if client is not None:
            client.add(job_id, req_id)

    def owner_of(self, job_id: str) -> Caller | None:
        owner = self.owners.get(job_id)
        return owner.caller if owner is not None else None

    def check_room(self, ident: bytes, count: int) -> None:
        """Refuse `count` more jobs past the caller's or the daemon's job cap."""
        client = self.clients.get(ident)
        mine = len(client.jobs) if client is not None else 0
        if mine + count > self.cfg.max_client_jobs:
            raise OverloadedError(
                f"this connection has {mine} live jobs; max_client_jobs is "
                f"{self.cfg.max_client_jobs}"
            )
        live = len(self.engine.scheduler)
        if live + count > self.cfg.max_jobs:
            raise OverloadedError(
                f"the daemon holds {live} live jobs; max_jobs is {self.cfg.max_jobs}"
            )

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
        ident = owner.caller.ident
        client = self.clients.get(ident)
        if client is not None:
            client.remove(out.request_id)
        self.send(ident, finished_message(out, owner.req_id))

    def _route(self, deltas: list[StepDelta]) -> None:
        per_client: dict[bytes, list[P.Chunk]] = defaultdict(list)
        for d in deltas:
            owner = self.owners.get(d.job_id)
            if owner is not None and owner.stream:
                per_client[owner.caller.ident].append(
                    P.Chunk(
                        req_id=owner.req_id,
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
            if client.jobs:
                log.info("client %r went silent: aborting its %d jobs", ident, len(client.jobs))
            for job_id in list(client.jobs):
                with contextlib.suppress(UnknownJobError):  # if alive after all, it hears
                    self.finished(self.engine.abort(job_id))
            self.control.scenarios.cancel(ident)
            del self.clients[ident]

    # ---- drain and shutdown --------------------------------------------------------

    def begin_drain(self, ident: bytes | None, timeout: float) -> None:
        self.draining = True
        if ident is not None:
            self.drain_waiters.append((ident, time.time() + timeout))

    def end_drain(self) -> None:
        """Accept jobs again; drain waiters hear that the drain was called off."""
        if self.stopping:
            raise ConfigError("the daemon is shutting down; it cannot undrain")
        self.draining = False
        remaining = len(self.engine.scheduler)
        for ident, _ in self.drain_waiters:
            self.send(
                ident,
                P.Ack(
                    what="drain",
                    detail={"drained": False, "undrained": True, "remaining": remaining},
                ),
            )
        self.drain_waiters = []

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

    def status(self, role: str = "client") -> P.StatusReply:
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
            role=role,
        )

    def close(self) -> None:
        self.auth.close()
        self.control.scenarios.close()
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
        message=out.error,
    )


def error_code(exc: FsdError) -> str:
    """A stable code for each kind of refusal."""
    if isinstance(exc, PromptTooLongError):
        return "prompt-too-long"
    if isinstance(exc, UnknownJobError):
        return "unknown-job"
    if isinstance(exc, ForbiddenError):
        return "forbidden"
    if isinstance(exc, OverloadedError):
        return "overloaded"
    if isinstance(exc, ConfigError):
        return "invalid"
    return "refused"
