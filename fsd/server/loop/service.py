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
`clients` keeps who is connected and whose each job is, `job_routing` sends tokens and
results to their owners and `control` answers each request type; the telemetry
(`fsd.server.publish.telemetry`) publishes snapshots and events.
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
from fsd.engine.face_protocol import Face
from fsd.engine.output import RequestOutput
from fsd.errors import ConfigError
from fsd.jobs import JobStatus
from fsd.metrics import SLOWindow
from fsd.server.heap_trim import IdleTrim
from fsd.server.log_limits import OnceLog  # (tests import it from here)
from fsd.server.loop.clients import ClientBook, ClientState
from fsd.server.loop.control import ControlHandler
from fsd.server.loop.frontend import FRAME_SLACK, Frontend
from fsd.server.loop.injector import ScenarioInjector
from fsd.server.loop.job_admission import Admission
from fsd.server.loop.job_routing import JobRouter
from fsd.server.loop.preview import PreviewRunner
from fsd.server.publish.stats_log import StatsLog
from fsd.server.publish.telemetry import Publisher, TelemetryPump
from fsd.server.roles import Authorizer
from fsd.server.security import Security
from fsd.server.transport import endpoints
from fsd.server.transport.gate import Gate, unpredictable_ids
from fsd.server.transport.ledger import InboundLedger
from fsd.version import __version__

log = logging.getLogger("fsd.server")
_ANSWER_LINGER = 1.0  # seconds closing waits for queued answers to leave the ROUTER


class EngineService:
    """Serves one engine, or N replicas behind one face (fsd.cluster), on a ROUTER
    (requests) and a PUB (telemetry) socket."""

    def __init__(self, face: Face, cfg: ServerConfig) -> None:
        """Bind the sockets (and the HTTP port); ConfigError naming the address if one
        cannot be bound, with everything opened so far closed again. `face`: all the
        loop sees of the engine (a `Face`: an `EngineFace` or a `ReplicaSetFace`)."""
        self.face = face
        self.cfg = cfg
        self.failures = OnceLog()
        self.book = ClientBook(cfg)  # who is connected, whose each job is
        self.slo = SLOWindow(cfg.slo_window, face.info.slo)
        # tokens and results to their owners
        self.routing = JobRouter(face, self.book, self.send, self.slo)
        self.admission = Admission(face, self.book, lambda: self.draining)
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
        self.http = None  # the OpenAI-compatible API and /metrics (fsd.server.http.server)
        self.ctx = zmq.Context()
        self.security: Security | None = None
        self.gate: Gate | None = None  # requests (fsd.server.transport.endpoints)
        self.telemetry_gate: Gate | None = None
        self.ledger: InboundLedger | None = None  # bytes of requests in flight
        # closed connections (gate thread): routing id, why the gate dropped it (or None)
        self._closed: deque[tuple[bytes, str | None]] = deque()
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
        endpoints.tune_router(self.router)
        self.router.setsockopt(zmq.MAXMSGSIZE, cfg.max_frame_bytes + FRAME_SLACK)
        configure = self.security.configure()
        if configure is not None:
            configure(self.router)
        if cfg.endpoint.startswith("inproc://"):  # in-process peers only: nothing to guard
            self.router.bind(cfg.endpoint)
        else:  # peers reach the ROUTER through the gate alone (fsd.server.transport.gate)
            on_close = lambda rid, why: self._closed.append((rid, why))  # noqa: E731
            self.gate = endpoints.request_gate(cfg, self.security.enabled, on_close, FRAME_SLACK)
            self.ledger = self.gate.limits.ledger
            self.router.bind(self.gate.upstream)
            self.gate.start()
        self._binding = telemetry = cfg.telemetry_endpoint
        if not telemetry.startswith("inproc://"):  # subscribers through a gate too
            self.telemetry_gate = endpoints.telemetry_gate(cfg, self.security.enabled)
            telemetry = self.telemetry_gate.upstream
        self.publisher = Publisher(self.ctx, telemetry, configure, endpoints.tune_pub)
        if self.telemetry_gate is not None:
            self.telemetry_gate.start()
        self.telemetry = TelemetryPump(self.face, self.slo, cfg, self.publisher)
        self.stats = StatsLog(self.face, cfg.stats_interval)  # the log's stats line
        self.trim = IdleTrim()  # freed heap back to the system when idle
        self.telemetry.taps.append(self.stats.saw_events)
        # after binding: a daemon that cannot bind must not replace a running one's token
        self.auth = Authorizer(cfg, self.security.operator_keys)
        if self.gate is not None:  # the operator's token reaches its reserved slots
            self.gate.operator_token = self.auth.token
        self.control = self._control(cfg)
        self.frontend = Frontend(  # the ROUTER socket's messages
            self.router,
            cfg,
            self.book,
            self.auth,
            self.control.dispatch,
            self.failures,
            self.security.enabled,
            self.ledger,
        )
        if cfg.http is not None:
            from fsd.server.http.server import HttpFrontend

            self._binding = f"http://{cfg.http}"
            self.http = HttpFrontend(
                cfg, self.face, self.ctx, self.router, self.publisher, self.auth.token
            )
            self.routing.taps.append(self.http.job_finished)  # /metrics histograms
            self.http.metrics.add_collector(
                lambda: endpoints.budget_figures(self.ledger, self.gate, self.telemetry_gate)
            )
            self.http.start()

    def _control(self, cfg: ServerConfig) -> ControlHandler:
        """The request handlers, each given what it uses."""
        face, finished = self.face, self.routing.finished
        scenarios = ScenarioInjector(
            face,
            self.admission,
            self.send,
            self.send_error,
            finished,
            lambda ident: ident in self.book.clients,
        )
        previews = PreviewRunner(face, self.send, self.slo.slo)
        return ControlHandler(
            face, self.send, self.book, self.admission, self, cfg, finished, scenarios, previews
        )

    def _abandon(self) -> None:
        """Close whatever `_open` opened before it failed."""
        with contextlib.suppress(Exception):
            if self.http is not None:
                self.http.stop()
        for gate in (self.gate, self.telemetry_gate):
            if gate is not None:
                gate.close()
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
            self.face.info.source,
            self.cfg.endpoint,
            self.cfg.telemetry_endpoint,
        )
        try:
            while not self._guarded("stopping", self._finished_stopping):
                self._guarded("scenarios", self.control.scenarios.pump, time.time())
                busy = self.face.busy()
                self._guarded("receiving", self._receive, not busy)
                self._guarded("connections", self._detach_closed)
                self._guarded("reaping", self._reap)
                if self.face.busy():
                    t0 = time.perf_counter()
                    self._step()
                    self.step_seconds += time.perf_counter() - t0
                self._guarded("previews", self.control.previews.pump)
                t0 = time.perf_counter()
                self._guarded("telemetry", self.telemetry.tick)
                self._guarded("stats", self.stats.tick)
                self._guarded("trim", self.trim.tick, self.face.busy())
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
        """One engine iteration; the engine fails a faulty job alone, and the face every
        job of a step that raises anyway (a bug), rather than the daemon."""
        stepped = self.face.step()
        for what, exc in stepped.failures:
            self.failures.exception(what, exc)
        self._guarded("routing tokens", self.routing.route, stepped.deltas)
        self._guarded("stats", self.stats.stepped, stepped)

    def _reap(self) -> None:
        """Silent sessions lose their jobs and their scenarios (fsd.server.loop.job_routing)."""
        heard = self.frontend.caught_up  # silence counts while the daemon listened
        if self.gate is not None:  # and while the gate relayed
            heard = min(heard, self.gate.heard_until)
        for ident in self.routing.reap_silent_clients(self.cfg.client_timeout, heard):
            self.control.scenarios.cancel(ident)

    def _detach_closed(self) -> None:
        """Sessions of connections the gate saw close hear nothing until resumed; those
        of connections it dropped (replies piling up unread) lose their jobs at once."""
        while self._closed:
            route, dropped = self._closed.popleft()
            client = self.book.session_of(route) if dropped is not None else None
            if client is not None:
                log.warning(
                    "session %s: its connection was dropped (%s); aborting its %d jobs",
                    client.key.decode(),
                    dropped,
                    len(client.jobs),
                )
                self.routing.abort_all(client)
                self.control.scenarios.cancel(client.key)
            self.book.detach(route)

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

    # ---- jobs (see fsd.server.loop.clients and fsd.server.loop.job_routing) -----------

    @property
    def clients(self) -> dict[bytes, ClientState]:
        return self.book.clients

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
        remaining = self.face.live()
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
        empty = not self.face.busy()
        keep = []
        for ident, deadline in self.drain_waiters:
            if empty or now >= deadline:
                self.send(
                    ident,
                    P.Ack(
                        what="drain",
                        detail={"drained": empty, "remaining": self.face.live()},
                    ),
                )
            else:
                keep.append((ident, deadline))
        self.drain_waiters = keep

    def _finished_stopping(self) -> bool:
        if not self.stopping:
            return False
        if self.face.busy() and time.time() < (self.stop_deadline or 0.0):
            return False
        for job in self.face.jobs():  # the drain ran out of time
            if job.state != JobStatus.FINISHED.value:
                self.finished(self.face.abort(job.job_id))
        return True

    def status(self, role: str = "client") -> P.StatusReply:
        snap = self.face.snapshot(with_jobs=False, detail=False)
        return P.StatusReply(
            pid=os.getpid(),
            version=__version__,
            model=self.face.info.source,
            policy=snap.sched.policy,
            kv_policy=snap.config.cache.kv_policy,
            uptime=time.time() - self.started,
            jobs=snap.live,
            running=snap.running,
            iterations=snap.iteration_count,
            draining=self.draining,
            degraded=self.degraded or snap.degraded,
            client_timeout=self.cfg.client_timeout,
            step_seconds=self.step_seconds,
            telemetry_seconds=self.telemetry_seconds,
            preview_seconds=self.control.previews.seconds,
            role=role,
            max_model_len=self.face.info.max_model_len,
            replicas=self.face.replica_count,
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
        self.face.close()
        self.ctx.term()
        for gate in (self.gate, self.telemetry_gate):
            if gate is not None:
                gate.close()
