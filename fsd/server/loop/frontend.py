"""The request socket's traffic: frames in (decoded, authorized, dispatched), replies out.

Nothing a client sends may raise out of here: a frame that does not decode, a
request that is refused and a request whose handler fails are each answered with an
`Error` (and a failure is logged), and the service's loop goes on.

Bytes: each message's bytes go back to the inbound ledger as it is read
(`fsd.server.transport.ledger`; the gate counted them on the way in), and an empty socket
settles the ledger's drift. A frame the gate refused arrives as its stand-in
(`fsd.server.transport.frames`) and is answered `Error` "overloaded" (or "too-large") with the
request's `req_id` when its first bytes hold one. A turn stops reading once its
replies reach `_TURN_REPLY_BYTES`, so the gate can move them (and drop a client that
does not read them, `fsd.server.transport.relay`) before more are made.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

import zmq

from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.errors import FsdError
from fsd.server.audit import connection_tag
from fsd.server.loop.clients import ClientBook, ClientState
from fsd.server.roles import Authorizer, Caller
from fsd.server.transport.frames import parse_standin
from fsd.server.transport.ledger import InboundLedger
from fsd.server.transport.msgpack_peek import prefix_req_id

log = logging.getLogger("fsd.server")

_MAX_MESSAGES_PER_TURN = 1000  # then run an iteration, so a flood cannot starve the engine
# and no longer while the engine has work: a turn of submits into a long queue is slow,
# and a short job needs about three iterations to finish
_TURN_SECONDS = 0.1
# ZeroMQ drops a bigger frame and the peer's connection without a word (a memory
# guard); frames between max_frame_bytes and this still get an `Error` "too-large"
FRAME_SLACK = 1024 * 1024
# requests that only ask: not answered once their connection closed (aborts still count)
_ANSWER_ONLY = (P.ListJobs, P.GetJob, P.Status, P.Ping, P.Preview)
# replies built once per engine state and sent to every asker (`ControlHandler.on_listjobs`)
_SHARED = (P.JobList,)
_MAX_ERROR_CHARS = 2000  # an Error never echoes more of a client's input than this
_TURN_REPLY_BYTES = 32 * 1024 * 1024  # replies one turn makes before the gate moves them


class Failures(Protocol):
    """Where a failure goes: logged once with its traceback (`service.OnceLog`)."""

    def exception(self, what: str, exc: BaseException) -> None: ...


class Frontend:
    """Reads and answers the clients' messages on the daemon's ROUTER socket.

    `dispatch(caller, msg)` answers one authorized request (`ControlHandler.dispatch`);
    `curve`: the socket authenticates peers, so frames carry the sender's key.
    """

    def __init__(
        self,
        router: zmq.Socket,
        cfg: ServerConfig,
        book: ClientBook,
        auth: Authorizer,
        dispatch: Callable[[Caller, P.Request], None],
        failures: Failures,
        curve: bool,
        ledger: InboundLedger | None = None,
    ) -> None:
        self.router = router
        self.ledger = ledger  # the gate's inbound budget (None: no gate, inproc)
        self.turn_bytes = 0  # bytes of replies sent this turn
        # the last shared reply and its encoding (`_SHARED`: a ListJobs flood encodes once)
        self._shared: tuple[P.Reply, bytes] | None = None
        self.cfg = cfg
        self.book = book
        self.auth = auth
        self.dispatch = dispatch
        self.failures = failures
        self.curve = curve
        # when the daemon last had read every frame waiting for it: a client's silence
        # counts only up to here (a frame sent since may still wait in the socket)
        self.caught_up = time.time()

    def receive(self, timeout_ms: int) -> None:
        """Wait up to `timeout_ms` for messages, then answer up to a turn's worth of them."""
        router = self.router
        if not router.poll(timeout_ms):
            self._caught_up()
            return
        curve = self.curve  # frames carry the sender's key (User-Id)
        self.turn_bytes = 0
        # the engine waits (timeout 0): its next iteration comes after _TURN_SECONDS
        end = time.perf_counter() + _TURN_SECONDS if not timeout_ms else math.inf
        for _ in range(_MAX_MESSAGES_PER_TURN):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK, copy=not curve)
            except zmq.Again:
                self._caught_up()
                return
            if self.ledger is not None:
                self._give_back(frames)
            self.handle(frames)
            if self.turn_bytes >= _TURN_REPLY_BYTES or time.perf_counter() > end:
                return

    def _give_back(self, frames: list) -> None:
        """A message's bytes back to the inbound ledger, if the gate counted them: under
        NULL the ledger knows the gate's routes (an in-process link's are not), under
        CURVE a gate connection's frames carry the key ZAP admitted (a link's none)."""
        assert self.ledger is not None
        if self.curve:
            if frames[-1].get("User-Id") is None:
                return
            key = None
        else:
            key = bytes(frames[0])
        for part in frames[1:]:
            self.ledger.give_back(key, len(part))

    def _caught_up(self) -> None:
        """Every waiting frame is read: silence counts from now, and drift settles."""
        self.caught_up = time.time()
        if self.ledger is not None:
            self.ledger.settle_if_idle()

    def handle(self, frames: list) -> None:  # bytes, or zmq.Frame with CURVE
        """Answer one client message; nothing it holds may raise out of here."""
        route = bytes(frames[0])
        try:
            self._handle_frames(route, frames)
        except Exception as exc:  # noqa: BLE001 - bad input must never kill the daemon
            self.failures.exception("handling a request failed", exc)
            self._to_route(route, P.Error(code="internal", message=f"{type(exc).__name__}: {exc}"))

    def _handle_frames(self, route: bytes, frames: list) -> None:
        # every frame's own User-Id: the key ZAP authenticated for this connection now
        user_id = frames[-1].get("User-Id") or None if isinstance(frames[-1], zmq.Frame) else None
        client = self.book.heard(route, time.time(), user_id)
        if len(frames) != 2:
            self._to_route(
                route, P.Error(code="malformed", message=f"expected 1 frame, got {len(frames) - 1}")
            )
            return
        payload = frames[1] if isinstance(frames[1], bytes) else frames[1].bytes
        refused = parse_standin(payload)
        if refused is not None:
            self._refused(route, *refused)
            return
        if len(payload) > self.cfg.max_frame_bytes:
            self._to_route(
                route,
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
            self._to_route(route, P.Error(code=exc.code, message=str(exc)))
            return
        if isinstance(msg, _ANSWER_ONLY) and self.book.closed(route):
            return  # nobody reads the answer: a dropped ListJobs flood cost 30 s of engine
        if isinstance(msg, P.Hello):
            self._hello(client, msg)
            return
        caller = client.caller(self.auth.role(msg, user_id), user_id)
        try:
            self.book.check(client, msg.session)
            self.auth.check(msg, caller.role)
            self.dispatch(caller, msg)
        except Exception as exc:  # noqa: BLE001 - FsdError is a refusal; others are bugs
            if not isinstance(exc, FsdError):  # a TypeError is answered "invalid", but logged
                self.failures.exception(f"request {type(msg).__name__} failed", exc)
            self.send_error(client.key, exc, getattr(msg, "req_id", None))

    def _refused(self, route: bytes, size: int, prefix: bytes) -> None:
        """The gate refused a frame of `size` bytes (its stand-in): the inbound budget
        was full, or the frame exceeds max_frame_bytes."""
        if size > self.cfg.max_frame_bytes:
            code = "too-large"
            text = f"frame of {size} bytes exceeds max_frame_bytes {self.cfg.max_frame_bytes}"
        else:
            code = "overloaded"
            text = (
                f"the daemon holds max_inbound_bytes ({self.cfg.max_inbound_bytes}) of "
                f"unread requests; this frame of {size} bytes was refused: send it again later"
            )
        self._to_route(route, P.Error(code=code, message=text, req_id=prefix_req_id(prefix)))

    def _hello(self, client: ClientState, msg: P.Hello) -> None:
        """Welcome: the session's secret; a resumed session's held answers follow it."""
        route = client.route
        session = self.book.hello(client, msg.session, time.time())
        resumed = session is not client
        held, dropped = self.book.take_held(session)
        ended = {m.req_id for m in held if isinstance(m, P.Finished)}
        jobs = sorted(session.req_ids | ended)
        if resumed:
            log.info(
                "session %s resumed with %d live jobs, %d results held, %d dropped",
                session.key.decode(), len(session.jobs), len(ended), len(dropped),
            )  # fmt: skip
        welcome = P.Welcome(session=session.secret or "", resumed=resumed, jobs=jobs, dropped=dropped)
        self._to_route(route, welcome)
        for msg in held:
            self._to_route(route, msg)

    def send(self, ident: bytes | None, msg: P.Reply) -> None:
        """To session `ident`'s connection; held for its next one while it has none."""
        if ident is None:
            return
        client = self.book.clients.get(ident)
        if client is None:
            return
        if client.route is None:
            self.book.keep(client, msg)
            return
        self._to_route(client.route, msg)

    def _to_route(self, route: bytes | None, msg: P.Reply) -> None:
        if route is None:
            return
        try:
            shared = self._shared
            if shared is not None and shared[0] is msg:
                payload = shared[1]
            else:
                payload = P.encode(msg)
                if isinstance(msg, _SHARED):
                    self._shared = (msg, payload)
            self.turn_bytes += len(payload)
            self.router.send_multipart([route, payload], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # a vanished peer or a full queue loses only its message
            log.debug("dropped a reply to connection %s: %s", connection_tag(route), exc)

    def send_error(self, ident: bytes, exc: BaseException, req_id: str | None = None) -> None:
        """An `Error` to session `ident` for a refusal (stable code) or a failure
        (code "internal")."""
        if isinstance(exc, FsdError):  # each class (a ProtocolError: each instance) has its code
            code, text = exc.code, str(exc)
        elif isinstance(exc, TypeError):  # a wrong type deep in a request's values
            code, text = "invalid", str(exc)
        else:
            code, text = "internal", f"{type(exc).__name__}: {exc}"
        if len(text) > _MAX_ERROR_CHARS:
            text = text[:_MAX_ERROR_CHARS] + "..."
        retry = getattr(exc, "retry_after", None)
        self.send(ident, P.Error(code=code, message=text, req_id=req_id, retry_after=retry))
