"""Listening sockets that survive running out of file descriptors.

With its open-files limit reached, a listening socket stays readable (a connection
waits) while every accept() fails with EMFILE. asyncio's accept loop then logs a
traceback per attempt ("socket.accept() out of system resource"), up to `backlog`
of them per wakeup, each scheduling another retry: a core spent and the log flooded
(docs/history.md). A `GuardedListener` (the gate's
and the HTTP server's listening sockets) answers for itself instead:

* out of descriptors, it closes a spare descriptor it keeps, accepts each waiting
  connection and closes it at once (the client sees the connection end, not a hang),
  takes the spare back, and tells asyncio there is nothing more to accept: no spin;
* if even that fails (another thread took the freed descriptor), asyncio gets the
  error once per wakeup, pauses accepting for a second (its own retry), and its
  traceback is dropped (`quiet_accept_errors`);
* before refusing, it asks every server that registered its idle connections
  (`add_reclaimer`: the HTTP server's, `fsd.server.http.idle`) to close its oldest
  idle ones: on its own loop the waiting connections are then taken on the next pass
  (the closed descriptors are free by then), so an idle flood churns among itself
  and a new client that speaks is served; another loop's are closed soon after, and
  the refused client's retry finds the room (with nothing idle within a second of
  an accept, the listener pauses instead of refusing: asyncio makes a connection's
  protocol a few passes after its accept, and only then can it be closed);
* the refusals are one WARNING line per 10 s at most, counting the refused and the
  closed (`fsd.server.log_limits.Throttle`), and accepting resumes by itself once
  descriptors are free again (the next accept succeeds).

`raise_fd_limit` lifts the soft open-files limit to the hard one at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

from fsd.server.log_limits import Throttle

log = logging.getLogger("fsd.server")

OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_ERROR = "socket.accept() out of system resource"  # asyncio's words
_BACKLOG = 128
_PAUSE = 0.5  # seconds after handing asyncio the error: its retry comes 1 s later
_RECLAIM = 16  # idle connections closed per failed accept
_BURST = 1.0  # seconds after an accept in which nothing idle means "not closable yet"
# close up to n idle connections: how many, and whether more become closable soon
Reclaim = Callable[[int], tuple[int, bool]]
_reclaimers: dict[int, tuple[asyncio.AbstractEventLoop, Reclaim]] = {}


def add_reclaimer(loop: asyncio.AbstractEventLoop, reclaim: Reclaim) -> Callable[[], None]:
    """Let listeners out of descriptors call `reclaim` (on `loop`); returns its removal."""
    key = id(reclaim)
    _reclaimers[key] = (loop, reclaim)

    def remove() -> None:
        _reclaimers.pop(key, None)

    return remove


def reclaim_idle(n: int) -> tuple[int, bool]:
    """Ask each registered server to close up to `n` idle connections: how many were
    closed on the running loop (other loops close theirs on their own thread), and
    whether this loop has idle ones that become closable soon."""
    here, closed, soon = asyncio.get_running_loop(), 0, False
    for loop, reclaim in list(_reclaimers.values()):
        if loop is here:
            made, young = reclaim(n)
            closed, soon = closed + made, soon or young
        else:
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(reclaim, n)
    return closed, soon


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft open-files limit to the hard one: (soft before, soft now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class GuardedListener(socket.socket):
    """A listening socket whose accept() sheds connections it has no descriptor for."""

    what: str = "a listener"
    throttle: Throttle
    spare: int | None = None
    refused: int = 0
    reclaimed: int = 0  # idle connections closed on this loop to take new ones
    _handed: float = float("-inf")  # when asyncio last got the error (loop time)
    _accepted_at: float = float("-inf")  # the last connection taken (monotonic)

    def guard(self, what: str) -> None:
        """Name it for the log and take its spare descriptor."""
        self.what, self.throttle, self.refused = what, Throttle(), 0
        self.spare = _spare()

    def accept(self) -> tuple[socket.socket, Any]:
        try:
            conn = super().accept()
        except OSError as exc:
            if exc.errno not in OUT_OF_FDS:
                raise
            return self._out_of_fds(exc)
        self._accepted_at = time.monotonic()
        if self.refused and self.spare is not None:
            self._log(f"accepting connections on {self.what} again")
            self.refused = 0
        return conn

    def _out_of_fds(self, exc: OSError) -> Any:
        closed, soon = reclaim_idle(_RECLAIM)
        if closed:  # the waiting connections are taken on the next pass, in their room
            self.reclaimed += closed
            self._log(f"out of file descriptors: closing the oldest idle connections on {self.what}")
            raise BlockingIOError(errno.EAGAIN, "room being made") from None
        if soon or _reclaimers and time.monotonic() - self._accepted_at < _BURST:
            # idle connections not closable yet (seen idle too briefly, or accepted a
            # moment ago: asyncio makes each protocol on a later pass): wait for them
            # rather than refuse
            return self._pause(exc)
        shed = self._shed()
        if shed is not None:  # (0: none was waiting: the table is merely full)
            if shed:
                self.refused += shed
                self._log(f"out of file descriptors: refusing connections on {self.what}")
            raise BlockingIOError(errno.EAGAIN, "nothing to accept") from None
        return self._pause(exc)

    def _pause(self, exc: OSError) -> Any:
        """Hand asyncio the error, once a wakeup: it stops accepting for a second."""
        now = asyncio.get_running_loop().time()
        if now - self._handed < _PAUSE:  # this wakeup's error is asyncio's already
            raise BlockingIOError(errno.EAGAIN, "paused") from None
        self._handed = now
        self._log(f"out of file descriptors: pausing connections on {self.what}")
        raise exc  # asyncio stops watching the socket and tries again in a second

    def _shed(self) -> int | None:
        """Accept and close each waiting connection in the spare's room: how many, or
        None if there was no room (the spare lost to another thread)."""
        shed = 0
        if self.spare is None:  # lost to a race once: take it back if there is room now
            self.spare = _spare()
        while self.spare is not None:
            os.close(self.spare)
            self.spare = None
            fd, drained = None, False
            try:
                fd, _ = self._accept()
            except BlockingIOError:
                drained = True  # none waits any more
            except OSError:
                pass  # the room was taken meanwhile
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)  # first: its slot is the spare's
                shed += 1
            self.spare = _spare()
            if fd is None:
                return shed if shed or drained else None
        return shed or None

    def _log(self, what: str) -> None:
        held = self.throttle.take()
        if held is not None:
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            log.warning(
                "%s (open-files limit %d; %d connections refused, %d idle ones closed so far)",
                what, limit, self.refused, self.reclaimed,
            )  # fmt: skip

    def close(self) -> None:
        if self.spare is not None:
            os.close(self.spare)
            self.spare = None
        super().close()


def _spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def tcp_listeners(host: str | None, port: int, what: str) -> list[GuardedListener]:
    """Guarded listening sockets on HOST:PORT (every interface when host is None), as
    asyncio's create_server would make them (SO_REUSEADDR, IPv6 sockets v6-only)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[GuardedListener] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            s = GuardedListener(family, kind, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(addr)
            s.listen(_BACKLOG)
            s.setblocking(False)
            s.guard(what)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


def unix_listener(path: str, what: str) -> GuardedListener:
    """A guarded listening socket on the Unix socket `path`."""
    s = GuardedListener(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)
        s.listen(_BACKLOG)
        s.setblocking(False)
        s.guard(what)
    except BaseException:
        s.close()
        raise
    return s


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loops' exception handler: a guarded listener's accept error was logged by
    the listener (throttled); everything else goes to asyncio's default handler."""
    if context.get("message") == ACCEPT_ERROR:
        return
    loop.default_exception_handler(context)
