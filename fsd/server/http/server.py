"""The HTTP frontend's life: an asyncio loop on its own thread inside the daemon.

It reaches the engine through an `inproc://` endpoint that the daemon's ROUTER also
binds: no TCP hop, no gate and no CURVE handshake (inproc never leaves the process),
while the requests still go through the same admission and validation as every
other client's. Telemetry reaches /metrics through a tap on the publisher and
finished jobs through `job_finished`, both queue puts; the HTTP thread does the rest.

HTTP users do not share one fate:
- requests spread over a pool of engine links (`links`, 4 sessions); a link
  that fails at the connection level is retired and replaced, and only the
  requests on it fail (503, in-band for a started stream);
- a link has no timeout, so no slow call ever resets it: each request has its own
  deadline instead (a request the engine does not take within `client_timeout` is
  answered 503 and its job aborted), and a request's error is its own;
- the daemon counts a session's silence only while it listened (`Frontend.caught_up`):
  a daemon stalled by a flood of huge frames no longer reaps the links, which aborted
  every HTTP stream at once;
- a job whose HTTP client left is aborted by its id whenever it did not finish, also
  when its handle ended in an error (`LinkPool.abandon`).

Slow peers hold neither connections nor memory (`limits`): a connection gets
`http_header_timeout` for each request head (aiohttp's keep-alive timer, also the
idle keep-alive limit), a body `http_body_timeout` (then 408, the connection closed,
its partial body freed), and the bodies being read hold `http_max_inflight_bytes`
at most across connections (then 503 with Retry-After). Out of file descriptors, the
oldest idle connections are closed to take new ones (`idle`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import zmq
import zmq.asyncio
from aiohttp import web

from fsd.client import AsyncClient
from fsd.config import ServerConfig
from fsd.config_checks import loopback_host, parse_http_address
from fsd.engine.face_protocol import Face
from fsd.engine.output import RequestOutput
from fsd.errors import ConfigError
from fsd.server.http.api import Backend, build_app
from fsd.server.http.chat_template import ChatTemplate
from fsd.server.http.heads import HEAD_BYTES, CountedSite, HeadBytes
from fsd.server.http.idle import IdleConnections
from fsd.server.http.limits import BodyBudget, runner_options
from fsd.server.http.links import LinkPool
from fsd.server.listen import add_reclaimer, tcp_listeners
from fsd.server.log_limits import http_server_logger
from fsd.server.loop_thread import LoopThread
from fsd.server.publish.prom import MetricsCollector
from fsd.server.publish.telemetry import Publisher

log = logging.getLogger("fsd.http")

_PUMP_INTERVAL = 0.5  # seconds between applying queued telemetry to the metrics
_START_TIMEOUT = 30.0


def served_name(cfg: ServerConfig, face: Face) -> str:
    """served_model_name, else the model as configured ("tiny", "/models/opt-125m")."""
    return cfg.served_model_name or face.info.model


def exposure_warning(cfg: ServerConfig) -> str | None:
    """What to warn about when HTTP listens beyond loopback without an API key (else None).

    Such a server is open to anyone who reaches the port: allowed (http_allow_remote),
    since a trusted network or a proxy that authenticates may be in front, but said
    loudly at every start.
    """
    if cfg.http is None or cfg.http_api_key is not None:
        return None
    host, port = parse_http_address(cfg.http)
    if loopback_host(host):
        return None
    return (
        f"HTTP on {host}:{port} has no http_api_key: anyone who reaches the port can use "
        "the API (submit jobs, read /metrics); set http_api_key, and put TLS in front"
    )


class HttpFrontend(LoopThread):
    """The OpenAI-compatible API and /metrics of one daemon; `start()` to serve.

    It submits over `router` (the daemon's ROUTER, which binds an inproc endpoint for
    it in `ctx`) and reads telemetry from `publisher`'s taps. Its links hold the
    operator `token`: they name each job's owner, the HTTP peer (`Submit.owner`).
    """

    def __init__(
        self,
        cfg: ServerConfig,
        face: Face,
        ctx: zmq.Context,
        router: zmq.Socket,
        publisher: Publisher,
        token: str | None = None,
    ) -> None:
        assert cfg.http is not None
        super().__init__("fsd-http")
        self.host, self.port = parse_http_address(cfg.http)
        self.cfg = cfg
        self.face = face
        self._ctx = ctx
        self._router = router
        self._publisher = publisher
        self._token = token
        self._telemetry = cfg.telemetry_hz > 0
        self._inproc = f"inproc://fsd-http-{id(self):x}"
        self.metrics = MetricsCollector(
            served_name(cfg, face),
            max_model_len=face.info.max_model_len,
            events=self._telemetry,
        )

    def start(self) -> None:
        """Listen; raise ConfigError if the address cannot be bound."""
        self._router.bind(self._inproc)
        self._publisher.taps.append(self.metrics.telemetry)
        error = self.start_thread(f"the HTTP server on {self.host}:{self.port}", _START_TIMEOUT)
        if error is not None:
            raise ConfigError(f"cannot serve HTTP on {self.host}:{self.port}: {error}")
        if not self._telemetry:
            log.warning(
                "telemetry_hz = 0: /metrics has counters and histograms but no gauges "
                "and no vllm:request_queue_time_seconds"
            )
        warning = exposure_warning(self.cfg)
        if warning is not None:
            log.warning("%s", warning)
        log.info("OpenAI-compatible API on http://%s:%d/v1", self.host, self.port)

    def job_finished(self, out: RequestOutput) -> None:
        """Called on the engine thread for every finished job (a queue put)."""
        self.metrics.job_finished(out)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close the engine client (before the daemon's context ends)."""
        self.signal_stop()
        self._thread.join(timeout)

    # ---- the thread ----------------------------------------------------------------

    def _backend(self) -> Backend:
        """What the routes use: the engine links, the model's facts, the limits."""
        cfg, info = self.cfg, self.face.info
        # a shadow shares the daemon's context, which inproc endpoints need
        ctx = zmq.asyncio.Context.shadow(self._ctx.underlying)
        # a link never times out, so it never resets and never leaves its jobs behind;
        # a request that waits too long is answered 503 by the route (api)
        links = LinkPool(
            lambda: AsyncClient(self._inproc, timeout=math.inf, context=ctx, token=self._token)
        )
        return Backend(
            links=links,
            model=self.metrics.model_name,
            created=int(time.time()),
            max_model_len=info.max_model_len,
            capacity=min(info.max_model_len, info.kv_tokens),
            tokenizer=self.face.tokenizer,
            template=ChatTemplate.for_model(info.source),
            metrics=self.metrics,
            bodies=BodyBudget(
                cfg.http_max_inflight_bytes, cfg.http_body_timeout, cfg.max_frame_bytes
            ),
            api_key=cfg.http_api_key,
            metrics_open=cfg.metrics_open,
            vocab_size=info.vocab_size,
            accept_timeout=cfg.client_timeout,
        )

    async def serve(self) -> None:
        cfg = self.cfg
        backend = self._backend()
        links = backend.links
        idle = IdleConnections()  # closable to make room when descriptors run out
        app = build_app(backend, cfg.max_frame_bytes, idle)
        # the engine has drained by the time this stops: open streams get a second, not 60.
        # handler_cancellation: a request whose client disconnects has its handler
        # cancelled, which aborts its job (api._serve), streaming or not.
        # auto_decompress off: request bodies are taken as sent, as vLLM's server takes
        # them (api answers 415 to a Content-Encoding). aiohttp's decoders bring
        # nothing an OpenAI client uses, and a risk: a truncated deflate body arriving
        # after its headers left the handler waiting for ever (aiohttp 3.14).
        # logger: a malformed request is one short throttled line (log_limits)
        runner = web.AppRunner(
            app,
            logger=http_server_logger(),
            access_log=None,
            shutdown_timeout=1.0,
            handler_cancellation=True,
            auto_decompress=False,
            **runner_options(cfg),  # the head deadline (http_limits)
        )
        await runner.setup()
        idle.server = runner.server
        heads = HeadBytes(HEAD_BYTES, cfg.http_max_inflight_bytes // 4, idle.busy)
        idle.ended = heads.ended
        remove_reclaimer = add_reclaimer(asyncio.get_running_loop(), idle.reclaim)
        try:  # guarded listening sockets (fsd.server.listen: out of descriptors, no spin)
            what = f"the HTTP server ({self.host}:{self.port})"
            for sock in tcp_listeners(self.host or None, self.port, what):
                await CountedSite(runner, sock, heads).start()
        except OSError as exc:
            remove_reclaimer()
            await runner.cleanup()
            await links.close()
            self._error = exc
            self.ready()
            return
        self.ready()
        pump = asyncio.create_task(self._pump())
        try:
            await self.stopped()
        finally:
            pump.cancel()
            remove_reclaimer()
            await links.close()  # first: open requests fail fast, and the sockets are gone
            await runner.cleanup()  # before the daemon terminates the shared context

    async def _pump(self) -> None:
        while True:
            self.metrics.pump()
            await asyncio.sleep(_PUMP_INTERVAL)
