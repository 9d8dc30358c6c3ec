"""The daemon's heartbeat: requests in, one engine iteration, tokens and telemetry out.

One thread owns the engine and the ROUTER socket, so nothing about the scheduler
needs locking; it polls the socket without blocking while there is work and blocks
on it when there is none (no busy loop). Telemetry is read here and sent from the
publisher's thread.

Nothing a client sends may end the loop: a frame that does not decode, a request
that fails, a job whose step fails (the engine fails that job alone) and any bug in
the loop's other duties are answered or logged, and the loop goes on. Each request
is checked against the sender's role (`fsd.server.roles`) and the job caps first.

The loop's parts live beside it: `frontend` reads and answers the ROUTER socket,
`clients` keeps who is connected and whose each job is, `routing` sends tokens and
results to their owners, `telemetry` publishes snapshots and events, and `control`
answers each request type.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.engine.core import Engine
from fsd.engine.output import RequestOutput
from fsd.errors import ConfigError
from fsd.jobs import JobStatus
from fsd.metrics import SLOWindow
from fsd.sched.slo import default_slo
from fsd.server.clients import ClientBook, ClientState
from fsd.server.control import ControlHandler
from fsd.server.frontend import FRAME_SLACK, Frontend
from fsd.server.gate import Gate, unpredictable_ids
from fsd.server.roles import Authorizer, Caller
from fsd.server.routing import JobRouter
from fsd.server.security import Security
from fsd.server.stats_log import StatsLog
from fsd.server.telemetry import Publisher, TelemetryPump
from fsd.version import __version__

log = logging.getLogger("fsd.server")
_ANSWER_LINGER = 1.0  # seconds closing waits for queued answers to leave the ROUTER


class OnceLog:
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
        self.failures = OnceLog()
        self.book = ClientBook(cfg)  # who is connected, whose each job is
        self.routing = JobRouter(self)  # tokens and results to their owners
        self.frontend = Frontend(self)  # the ROUTER socket's messages
        self.slo = SLOWindow(cfg.slo_window, default_slo(engine.cost))
        self.started = time.time()
        self.draining = False
        self.stopping = False
        self.stop_deadline: float | None = None
        self.drain_waiters: list[tuple[bytes, float]] = []  # (client, deadline)
        self.degraded: str | None = None
        self.telemetry_enabled = cfg.telemetry_hz > 0
        # engine-thread seconds in model steps and in telemetry (what telemetry costs)
        self.step_seconds = 0.0
        self.telemetry_seconds = 0.0
        self.http = None  # the OpenAI-compatible API and /metrics (fsd.server.http_server)
        self.ctx = zmq.Context()
        self.security: Security | None = None
        self.gate: Gate | None = None
        self._closed: deque[bytes] = deque()  # routing ids of closed connections (gate thread)
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
        unpredictable_ids()  # before the ROUTER exists: its made-up ids start from rand()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.SNDHWM, 100_000)
        self.router.setsockopt(zmq.RCVHWM, 100_000)
        self.router.setsockopt(zmq.MAXMSGSIZE, cfg.max_frame_bytes + FRAME_SLACK)
        configure = self.security.configure()
        if configure is not None:
            configure(self.router)
        if cfg.endpoint.startswith("inproc://"):  # in-process peers only: nothing to guard
            self.router.bind(cfg.endpoint)
        else:  # peers reach the ROUTER through the gate alone (fsd.server.gate)
            self.gate = Gate(
                cfg.endpoint,
                curve=self.security.enabled,
                max_connections=cfg.max_connections,
                on_close=self._closed.append,
            )
            self.router.bind(self.gate.upstream)
            self.gate.start()
        self._binding = cfg.telemetry_endpoint
        self.publisher = Publisher(self.ctx, cfg.telemetry_endpoint, configure)
        self.telemetry = TelemetryPump(self.engine, self.slo, cfg, self.publisher)
        self.stats = StatsLog(self.engine, cfg.stats_interval)  # the log's stats line
        self.telemetry.taps.append(self.stats.saw_events)
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
        if self.gate is not None:
            self.gate.close()
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
                self._guarded("connections", self._detach_closed)
                self._guarded("reaping", self.routing.reap_silent_clients)
                if self.engine.has_unfinished():
                    t0 = time.perf_counter()
                    self._step()
                    t1 = time.perf_counter()
                    self.step_seconds += t1 - t0
                    self._guarded("history", self._record_step, t0, t1)
                self._guarded("previews", self.control.previews.pump)
                t0 = time.perf_counter()
                self._guarded("telemetry", self.telemetry.tick)
                self._guarded("stats", self.stats.tick)
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
            self.failures.exception(f"the loop's {what} failed", exc)
            return None

    def _step(self) -> None:
        """One engine iteration; the engine fails a faulty job alone, never raising. If
        it raises anyway (a bug), its jobs fail rather than the daemon."""
        try:
            deltas = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - last resort
            self.failures.exception("an engine step failed; its jobs are failed", exc)
            deltas = self.engine.fail_all(f"internal error: {type(exc).__name__}: {exc}")
        self._guarded("routing tokens", self.routing.route, deltas)
        self._guarded("stats", self.stats.stepped, deltas)

    def _detach_closed(self) -> None:
        """Sessions of connections the gate saw close hear nothing until resumed."""
        while self._closed:
            self.book.detach(self._closed.popleft())

    def _record_step(self, start: float, end: float) -> None:
        """The iteration's wall time for the what-if twin's clock (fsd.engine.history)."""
        eng = self.engine
        out = eng.last_schedule
        ran = out is not None and bool(out.batch)
        predicted = eng.scheduler.predicted_iteration_time
        eng.history.stepped(start, end, predicted, ran, eng.has_unfinished())

    def _receive(self, block: bool) -> None:
        timeout = 0
        if block:
            timeout = 200
            if self.telemetry_enabled:
                wake = self.telemetry.wake_time()
                timeout = int(max(0.0, min(0.2, wake - time.time())) * 1000)
            if self.control.previews.running is not None:  # answer a preview promptly
                timeout = min(timeout, 50)
            due = self.control.scenarios.next_due()
            if due is not None:  # wake for a scenario's next arrival, not 200 ms late
                timeout = min(timeout, int(max(0.0, due - time.time()) * 1000))
        self.frontend.receive(timeout)

    def send(self, ident: bytes | None, msg: P.Reply) -> None:
        self.frontend.send(ident, msg)

    def send_error(self, ident: bytes, exc: BaseException, req_id: str | None = None) -> None:
        """An `Error` for a refusal (stable code) or a failure (code "internal")."""
        self.frontend.send_error(ident, exc, req_id)

    # ---- jobs (see fsd.server.clients and fsd.server.routing) -----------------------

    @property
    def clients(self) -> dict[bytes, ClientState]:
        return self.book.clients

    def own(self, job_id: str, caller: Caller, req_id: str, stream: bool = True) -> None:
        """`job_id` is `caller`'s: streamed to it (or only finished), reaped with it."""
        self.book.own(job_id, caller, req_id, stream)

    def owner_of(self, job_id: str) -> Caller | None:
        return self.book.owner_of(job_id)

    def check_room(self, ident: bytes, count: int) -> None:
        """Refuse `count` more jobs past the caller's or the daemon's job cap."""
        self.book.check_room(ident, count, len(self.engine.scheduler))

    def finished(self, out: RequestOutput) -> None:
        """Record a job's end and tell its client."""
        self.routing.finished(out)

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
            preview_seconds=self.control.previews.seconds,
            role=role,
            max_model_len=self.engine.max_model_len,
        )

    def close(self) -> None:
        self.auth.close()
        self.control.scenarios.close()
        self.control.previews.close()
        if self.http is not None:  # its socket must close before the context terminates
            self.http.stop()
        self.telemetry.flush()
        self.publisher.close()
        # answers already sent (the Ack of Shutdown) still leave: the ROUTER lingers
        # until they are out, then the gate relays them before it closes
        self.router.close(linger=int(_ANSWER_LINGER * 1000))
        self.security.close()
        self.engine.close()
        self.ctx.term()
        if self.gate is not None:
            self.gate.close()
