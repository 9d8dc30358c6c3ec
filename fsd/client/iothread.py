"""The sync client's I/O thread: the one thread that owns its DEALER socket.

A ZeroMQ socket must stay on one thread, so `Client` callers hand this thread
`Outgoing` requests through a queue (and a self-pipe to wake it); it sends them,
feeds every frame it receives to the socket-free `ClientCore`, which routes answers
to the callers' futures and stream queues, and acts on the core's clock: pings,
probes, and a fresh socket when the daemon stopped answering.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from fsd.client.base import log
from fsd.client.core import ClientCore
from fsd.client.keys import connect
from fsd.errors import FsdError


@dataclass
class Outgoing:
    """One request for the I/O thread: a frame and where its answer goes."""

    frame: bytes
    req_id: str | None = None  # a Submit: its stream queue is `sink`
    sink: Any = None
    key: str | None = None  # a control call: its future is `sink`
    extra: float = 0.0
    deferred: bool = False
    call_id: str | None = None  # a call answered by id (Inject)


_CLOSE = object()


class IOThread:
    """Runs one client's socket on its own thread until `close`."""

    def __init__(
        self,
        core: ClientCore,
        ctx: zmq.Context,
        endpoint: str,
        keys: tuple[bytes, bytes, bytes] | None,
    ) -> None:
        self._core = core
        self._ctx = ctx
        self._endpoint = endpoint
        self._keys = keys
        self._sock = connect(ctx, zmq.DEALER, endpoint, keys)
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fsd-client", daemon=True)
        self._thread.start()

    def put(self, item: Outgoing) -> None:
        with self._lock:
            if self._closed:
                raise FsdError("this fsd Client is closed")
            self._outbox.put(item)
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        """Abort the streaming and held jobs, fail what is pending, stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._outbox.put(_CLOSE)
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=5.0)
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ---- on the thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a bug here must not leave callers waiting forever
            log.exception("the fsd client I/O thread failed")
            self._core.fail_all(FsdError(f"the fsd client I/O thread failed: {exc}"))
            self._sock.close(linger=0)

    def _loop(self) -> None:
        core, sock = self._core, self._sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        closing = False
        while not closing:
            wait = core.next_wakeup(time.monotonic())
            events = dict(poller.poll(None if wait is None else wait * 1000 + 1))
            now = time.monotonic()
            if self._wake_r in events:
                _drain_pipe(self._wake_r)
            closing = self._send_outbox(sock, now)
            if sock in events:
                _recv_all(sock, core, now)
            if core.expired(now) and not _recv_all(sock, core, now) and core.expired(now):
                core.reset(now)
                poller.unregister(sock)
                sock.close(linger=0)
                sock = self._sock = connect(self._ctx, zmq.DEALER, self._endpoint, self._keys)
                poller.register(sock, zmq.POLLIN)
            for frame in core.tick(now):
                _send(sock, frame, core, now)
        aborts = core.abort_frames()
        for frame in aborts:
            _send(sock, frame, core, now)
        core.fail_all(FsdError("the fsd Client was closed"))
        sock.close(linger=200 if aborts else 0)

    def _send_outbox(self, sock: zmq.Socket, now: float) -> bool:
        """Send every queued request; whether the client asked to close."""
        closing = False
        while True:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                return closing
            if item is _CLOSE:
                closing = True
            else:
                self._send_out(sock, item, now)

    def _send_out(self, sock: zmq.Socket, item: Outgoing, now: float) -> None:
        core = self._core
        if item.req_id is not None:
            core.add_stream(item.req_id, item.sink, now)
        else:
            core.add_call(item.key or "?", item.sink, now, item.extra, item.deferred, item.call_id)
        _send(sock, item.frame, core, now)  # if it cannot go, its deadline expires


def _send(sock: zmq.Socket, frame: bytes, core: ClientCore, now: float) -> None:
    try:
        for hello in core.before_send():  # a new socket's first frame
            sock.send(hello, zmq.NOBLOCK)
        sock.send(frame, zmq.NOBLOCK)
    except zmq.Again:  # the send queue is full: the daemon has not read for a long time
        return
    core.sent(now)


def _recv_all(sock: zmq.Socket, core: ClientCore, now: float) -> int:
    """Route every frame waiting on the socket; how many there were."""
    count = 0
    while True:
        try:
            core.on_frame(sock.recv(zmq.NOBLOCK), now)
        except zmq.Again:
            return count
        count += 1


def _drain_pipe(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass
