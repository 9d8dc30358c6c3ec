"""Process life of the daemon: foreground serving, signals, graceful drain, logging.

`serve_foreground` holds the pidfile lock (`fsd.pidfile`) for the daemon's whole
life, checks its addresses before the model loads, and serves until a signal:
SIGTERM and SIGINT drain (no new jobs, in-flight jobs finish up to a timeout, then
the process exits); a second signal stops at once. Starting a detached daemon and
stopping one from the `fsd` command are in `fsd.daemon_control`; this module
re-exports them, and the pidfile helpers, under their old names.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import time
from types import FrameType
from typing import Any

from fsd.config import ClusterConfig, EngineConfig, ServerConfig
from fsd.config_checks import parse_http_address
from fsd.credentials import token_path
from fsd.daemon_control import DRAIN_TIMEOUT, START_TIMEOUT, start_background, stop
from fsd.engine.face_protocol import Face
from fsd.logfile import LOG_FORMAT, log_handler
from fsd.pidfile import DaemonError, PidLock, probe_pidfile, read_pidfile, state_files

__all__ = [
    "DRAIN_TIMEOUT",
    "START_TIMEOUT",
    "DaemonError",
    "PidLock",
    "bind_error",
    "check_addresses",
    "probe_pidfile",
    "read_pidfile",
    "serve_foreground",
    "setup_logging",
    "start_background",
    "state_files",
    "stop",
]

log = logging.getLogger("fsd.daemon")


def bind_error(address: str, exc: OSError | Exception) -> str:
    """One line for a socket that cannot be bound, naming the address and the likely cause."""
    code = getattr(exc, "errno", None)
    if code in errno.errorcode:  # the system's words (pyzmq's also repeat the address)
        reason = os.strerror(code)
    else:
        reason = getattr(exc, "strerror", None) or str(exc)
    if code == errno.EADDRINUSE:
        return f"cannot bind {address}: {reason} (another fsd daemon or program listens there)"
    return f"cannot bind {address}: {reason}"


def check_addresses(cfg: ServerConfig) -> None:
    """Refuse now what the service would refuse after the model loaded.

    ConfigError for the security settings (keys, loopback-only); DaemonError if a TCP
    endpoint or the HTTP address cannot be bound. So a busy port or a bad key fails
    in a second, not after a minute of loading, and the error names the address.
    (ipc:// is not checked: binding it would take the path over from its server.)
    """
    import zmq

    from fsd.server.security import Security, is_loopback

    ctx = zmq.Context()
    try:
        Security(ctx, cfg).close()  # keys, folders, loopback-only: refused before loading too
        for ep in (cfg.endpoint, cfg.telemetry_endpoint):
            if not ep.startswith("tcp://"):
                continue
            if not is_loopback(ep) and cfg.curve_secret_key is None:
                continue  # refused by the security check, not opened even for a moment
            sock = ctx.socket(zmq.PUB)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.bind(ep)
            except zmq.ZMQError as exc:
                raise DaemonError(bind_error(ep, exc)) from None
            finally:
                sock.close(linger=0)
    finally:
        ctx.term()
    if cfg.http is not None:
        host, port = parse_http_address(cfg.http)
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise DaemonError(f"cannot serve HTTP on {cfg.http}: {exc}") from None
        family, kind, proto, _, addr = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server does
            try:
                s.bind(addr)
            except OSError as exc:
                raise DaemonError(bind_error(f"http://{cfg.http}", exc)) from None


def _load(engine_cfg: EngineConfig, cluster: ClusterConfig) -> Face:
    """The engine's face, its model loaded and its cost model known (logged); with
    several replicas, theirs behind one face (fsd.cluster), routed by `cluster.router`."""
    from fsd.engine.core import Engine
    from fsd.engine.face import EngineFace
    from fsd.twin.snapshot import take_snapshot

    if cluster.replicas > 1:
        from fsd.cluster.start import start_replicas

        t0 = time.monotonic()
        face = start_replicas(engine_cfg, cluster.replicas, cluster=cluster)
        log.info(
            "%d replicas of %s up in %.1f s (router %s; %d device KV blocks each)",
            cluster.replicas, face.info.source, time.monotonic() - t0, cluster.router,
            face.info.kv_tokens // engine_cfg.cache.block_size,
        )  # fmt: skip
        return face

    t0 = time.monotonic()
    engine = Engine(engine_cfg)
    log.info(
        "loaded %s in %.1f s: %d device and %d host KV blocks, cost model %s",
        engine.loaded.source,
        time.monotonic() - t0,
        engine.blocks.device.num_blocks,
        engine.blocks.host.num_blocks,
        engine.cost.name,
    )
    return EngineFace(engine, events=True, snapshot=take_snapshot)


def _serve_on(face: Face, cfg: ServerConfig) -> Any:
    """EngineService(face, cfg), with a bind failure as one DaemonError line."""
    import zmq

    from fsd.server.loop.service import EngineService

    try:
        return EngineService(face, cfg)
    except zmq.ZMQError as exc:
        # a port taken since check_addresses (which names it); the service may hold
        # the other one by now, so checking again could blame the wrong address
        both = f"{cfg.endpoint} or {cfg.telemetry_endpoint}"
        raise DaemonError(bind_error(both, exc)) from None


def _raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one, and say so once."""
    from fsd.server.listen import raise_fd_limit

    before, now = raise_fd_limit()
    if now > before:
        log.info("raised the open-files limit from %d to %d (its hard limit)", before, now)
    else:
        log.info("open-files limit %d (the hard limit: not raised)", now)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def serve_foreground(
    engine_cfg: EngineConfig, server_cfg: ServerConfig, cluster: ClusterConfig | None = None
) -> None:
    """Load the model (on each replica) and serve until shut down (what systemd or a
    container runs)."""
    pidfile, logfile = state_files(server_cfg)
    lock = PidLock(pidfile, server_cfg.endpoint)  # first: two starts never both load
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "state": "starting",
        "endpoint": server_cfg.endpoint,
        "telemetry_endpoint": server_cfg.telemetry_endpoint,
        "log": str(logfile),
        "state_dir": str(pidfile.parent.resolve()),  # `fsd stop` checks the pid serves it
    }
    try:
        lock.write(info)
        # a killed daemon's token goes now, not once this one has loaded (clients
        # ignore it anyway: fsd.credentials); the service writes a new one
        with contextlib.suppress(OSError):  # a folder there: refused when writing ours
            token_path(server_cfg.state_dir, server_cfg.endpoint).unlink(missing_ok=True)
        # until the service drains on a signal, one ends the start (the lock is released)
        signal.signal(signal.SIGTERM, _exit_on_signal)
        signal.signal(signal.SIGINT, _exit_on_signal)
        check_addresses(server_cfg)
        _raise_fd_limit()
        m = engine_cfg.model
        # what `fsd start` shows while it waits, and the operator's record of the start
        log.info(
            "loading %s (device %s, dtype %s), then its cost model", m.model, m.device, m.dtype
        )
        face = _load(engine_cfg, cluster or ClusterConfig())
        try:
            service = _serve_on(face, server_cfg)
        except BaseException:
            face.close()
            raise
        signals = {"count": 0}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            signals["count"] += 1
            drain = signals["count"] == 1
            log.info("signal %d: %s", signum, "draining" if drain else "stopping now")
            service.begin_shutdown(drain=drain, timeout=DRAIN_TIMEOUT)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # readiness: `fsd start` waits for exactly this (sockets bound, signals drain)
        lock.write(
            {**info, "state": "serving", "model": face.info.source, "started": time.time()}
        )
        try:
            service.run()
        finally:
            log.info("stopped")
    finally:
        lock.release()


def setup_logging(level: str, server_cfg: ServerConfig | None = None) -> None:
    """Log at `level` to stderr; to the rotated state log file when stderr is that file
    (a daemon `fsd start` started in the background: fsd.logfile)."""
    logfile = state_files(server_cfg)[1] if server_cfg is not None else None
    max_bytes = server_cfg.log_max_bytes if server_cfg is not None else 0
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=LOG_FORMAT,
        handlers=[log_handler(logfile, max_bytes)],
    )
