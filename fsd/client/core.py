"""The socket-free core of the client SDK: routing replies and keeping time.

`ClientCore` is the brain of the `AsyncClient` (whose event loop also serves the
sync `Client`). It never touches a socket: the I/O side feeds it frames and the
clock, and sends what it asks for. Routing rules:

- `Accepted`, `Tokens` chunks, `Finished` and an `Error` that names a `req_id` go to
  that request's stream (a queue with `put_nowait`);
- every other reply answers a control call. Control replies carry no id, so a reply
  goes to the oldest pending call that expects its kind (`StatusReply` → status,
  `Ack(what="abort")` → abort...), and an id-less `Error` to the oldest call whose
  answer is not deferred (drain and shutdown may answer late).

Injected jobs (`Inject`) belong to the client that injected them: the daemon sends
no tokens for them, only each one's `Finished` (req_id = job id). The core holds
their ids from the `Ack` on, heartbeats while any is held, hands each `Finished` to
the `injected` sink, and aborts them when the client closes, like streams.

A `Preview` (what-if run of the daemon's twin) is answered by id as well, once its
simulations end: the `PreviewReply`, or an `Error`, carries the request's `req_id`.

An `Error` of code "duplicate-req-id" refuses a second submit under the id of a job
that streams already: it is logged, and that job's stream goes on.

Liveness: a call or an unaccepted submit without an answer within `timeout` means
the daemon is gone → every pending request fails with `DaemonUnavailable` and the
I/O side recreates its socket. While jobs stream, a `Ping` goes out every
`heartbeat` seconds, and after `timeout` seconds of silence a `Status` probe checks
that the daemon still lives (jobs may legitimately wait long between tokens).
"""

from __future__ import annotations

import itertools
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fsd import protocol as P
from fsd.client.base import check_frame, log
from fsd.client.errors import DaemonUnavailable, RequestError, unavailable


@dataclass
class _Stream:
    sink: Any  # an asyncio.Queue (any put_nowait(item))
    deadline: float | None  # until Accepted (or resumed); None once accepted
    job_id: str | None = None
    tokens: int = 0  # output tokens passed on so far
    gapped: bool = False  # a chunk went missing: the rest comes with the Finished
    resuming: bool = False  # waiting for the Welcome of a new connection


@dataclass
class _Call:
    key: str
    future: Any  # an asyncio.Future; None for the probe
    deadline: float
    deferred: bool = False
    req_id: str | None = None  # a call whose answer names it (Inject, Preview)


_REPLY_KEYS = {P.StatusReply: "status", P.JobList: "jobs", P.JobReply: "job", P.PreviewReply: "preview"}  # fmt: skip


def answered_by_id(msg: P.Request) -> str | None:
    """The id a request's answer will carry, for requests answered by id (Inject: a
    scenario is answered once checked; Preview: once its runs end; both after other
    calls' answers)."""
    return msg.req_id if isinstance(msg, P.Inject | P.Preview) else None


def reply_key(msg: P.Reply) -> str:
    """Which control call a reply answers: "status", "jobs", "job", "preview" or
    "ack:<what>"."""
    if isinstance(msg, P.Ack):
        return f"ack:{msg.what}"
    return _REPLY_KEYS.get(type(msg), "?")


# replies that name their request: a stream's, an injected job's, or a call's by id
_NAMED = (P.Finished, P.Error, P.Ack, P.PreviewReply)


@dataclass
class ClientCore:
    """Routing table and liveness clock of one client socket (see the module doc)."""

    endpoint: str
    timeout: float
    heartbeat: float
    curve: bool = False
    token: str | None = None  # the operator token, sent with every request
    streams: dict[str, _Stream] = field(default_factory=dict)
    calls: list[_Call] = field(default_factory=list)
    held: set[str] = field(default_factory=set)  # injected jobs not finished yet
    injected: Any = None  # sink (put_nowait) of the injected jobs' Finished messages
    last_rx: float = 0.0
    last_tx: float = 0.0
    session: str | None = None  # the secret of this client's session (from Welcome)

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]
        self._hello_due = True  # a new socket says Hello before anything else

    def encode(self, msg: P.Request) -> bytes:
        """A request's frame, carrying the operator token when this client has one."""
        if self.token is not None:
            msg.token = self.token
        if self.session is not None:
            msg.session = self.session
        return check_frame(P.encode(msg))

    def before_send(self) -> list[bytes]:
        """The Hello a new socket owes before its first frame (resuming the session)."""
        if not self._hello_due:
            return []
        self._hello_due = False
        # (with the token: a daemon whose connections are all taken reads it to let
        # the operator into its reserved ones, fsd.server.transport.slots)
        return [check_frame(P.encode(P.Hello(session=self.session, token=self.token)))]

    def next_req_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def add_stream(self, req_id: str, sink: Any, now: float) -> None:
        self.streams[req_id] = _Stream(sink, now + self.timeout)

    def add_call(
        self,
        key: str,
        future: Any,
        now: float,
        extra: float = 0.0,
        deferred: bool = False,
        req_id: str | None = None,
    ) -> None:
        self.calls.append(_Call(key, future, now + self.timeout + extra, deferred, req_id))

    def sent(self, now: float) -> None:
        self.last_tx = now

    def on_frame(self, frame: bytes, now: float) -> None:
        self.last_rx = now
        try:
            msg = P.decode_reply(frame)
        except P.ProtocolError as exc:  # a daemon of another protocol version
            self.fail_all(RequestError(exc.code, str(exc)))
            return
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("dropping an undecodable frame from %s: %s", self.endpoint, exc)
            return
        self.route(msg)

    def route(self, msg: P.Reply) -> None:
        if isinstance(msg, P.Tokens):
            for chunk in msg.chunks:
                stream = self.streams.get(chunk.req_id)
                if stream is not None:
                    self._chunk(stream, chunk)
        elif isinstance(msg, P.Welcome):
            self._welcome(msg)
        elif isinstance(msg, P.Accepted):
            if msg.client_timeout > 0:  # heartbeat well inside the daemon's patience
                self.heartbeat = min(self.heartbeat, msg.client_timeout / 3)
            stream = self.streams.get(msg.req_id)
            if stream is not None:
                stream.deadline, stream.job_id = None, msg.job_id
                stream.sink.put_nowait(msg)
        elif isinstance(msg, _NAMED) and msg.req_id is not None:
            self._route_named(msg, msg.req_id)
        else:
            self._answer(msg)

    def _chunk(self, stream: _Stream, chunk: P.Chunk) -> None:
        """Pass a chunk on unless one before it went missing (a reconnect's gap)."""
        if chunk.start is not None and chunk.start != stream.tokens:
            stream.gapped = True  # the handle's JobState takes the rest from the Finished
        if stream.gapped:
            return
        stream.tokens += len(chunk.token_ids)
        stream.sink.put_nowait(chunk)

    def _welcome(self, msg: P.Welcome) -> None:
        """A (new) connection's session: resumed streams go on, the others are lost."""
        self.session = msg.session
        live = set(msg.jobs) if msg.resumed else set()
        dropped = set(msg.dropped) if msg.resumed else set()
        for req_id, stream in list(self.streams.items()):
            if not stream.resuming:
                continue
            if req_id in live:
                stream.resuming, stream.deadline = False, None
                continue
            del self.streams[req_id]
            stream.sink.put_nowait(_not_resumed(stream.job_id, req_id, req_id in dropped))
        lost = self.held - live
        if lost:
            self.held -= lost
            if self.injected is not None:
                self.injected.put_nowait(RequestError("lost", f"{len(lost)} injected jobs lost"))

    def _route_named(self, msg: P.Finished | P.Error | P.Ack | P.PreviewReply, req_id: str) -> None:
        stream = self.streams.get(req_id)
        if stream is not None and isinstance(msg, P.Finished | P.Error):
            if isinstance(msg, P.Error) and msg.code == "duplicate-req-id":
                log.warning("the daemon refused a duplicate submit of %s: %s", req_id, msg.message)
                return  # the job already under that id streams on
            del self.streams[req_id]
            stream.sink.put_nowait(msg)
            return
        if isinstance(msg, P.Finished) and req_id in self.held:
            self.held.discard(req_id)
            if self.injected is not None:
                self.injected.put_nowait(msg)
            return
        call = next((c for c in self.calls if c.req_id == req_id), None)
        if call is None:
            log.debug("dropping a reply for %s: %r", req_id, msg)
            return
        self._settle(call, msg)

    def _answer(self, msg: P.Reply) -> None:
        # calls answered by id come last: a reply without one is theirs only when no
        # other call could take it
        calls = sorted(self.calls, key=lambda c: c.req_id is not None)
        if isinstance(msg, P.Error):
            candidates = [c for c in calls if not c.deferred] or calls
        else:
            key = reply_key(msg)
            candidates = [c for c in calls if c.key == key]
        if not candidates:
            log.debug("dropping an unexpected reply: %r", msg)
            return
        self._settle(candidates[0], msg)

    def _settle(self, call: _Call, msg: P.Reply) -> None:
        self.calls.remove(call)
        if isinstance(msg, P.Ack) and msg.what == "inject":  # from now on they are ours
            self.held.update(str(j) for j in msg.detail.get("job_ids", ()))
        if call.future is not None and not call.future.done():
            call.future.set_result(msg)

    def expired(self, now: float) -> bool:
        """Whether a call or an unaccepted submit has waited past its deadline."""
        return any(c.deadline <= now for c in self.calls) or any(
            s.deadline is not None and s.deadline <= now for s in self.streams.values()
        )

    def tick(self, now: float) -> list[bytes]:
        """Frames due now: a heartbeat while jobs are out, a probe after long silence
        (after the Hello a new socket owes)."""
        out: list[bytes] = []
        if not self.streams and not self.held:
            return out
        out += self.before_send()
        if now - self.last_tx >= self.heartbeat:
            out.append(self.encode(P.Ping()))
        if self._probe_due(now):
            self.add_call("status", None, now)
            out.append(self.encode(P.Status()))
        return out

    def _probe_due(self, now: float) -> bool:
        accepted = bool(self.held) or any(s.deadline is None for s in self.streams.values())
        return accepted and now - self.last_rx >= self.timeout and not self.calls

    def next_wakeup(self, now: float) -> float | None:
        """Seconds until `expired` or `tick` may have something to do (None: never)."""
        times = [c.deadline for c in self.calls]
        times += [s.deadline for s in self.streams.values() if s.deadline is not None]
        if self.streams or self.held:
            times.append(self.last_tx + self.heartbeat)
            if not self.calls:
                times.append(self.last_rx + self.timeout)
        if not times or min(times) == math.inf:  # a link without timeouts, nothing due
            return None
        return max(0.0, min(times) - now)

    def fail_all(self, exc: BaseException) -> None:
        """Every pending call and stream ends with `exc` (socket lost or client closed)."""
        streams, calls, held = self.streams, self.calls, self.held
        self.streams, self.calls, self.held = {}, [], set()
        for stream in streams.values():
            stream.sink.put_nowait(exc)
        if held and self.injected is not None:
            self.injected.put_nowait(exc)
        for call in calls:
            if call.future is not None and not call.future.done():
                call.future.set_exception(exc)

    def reset(self, now: float) -> DaemonUnavailable:
        """The daemon did not answer: the caller makes a new socket. Pending calls and
        unaccepted submits fail; accepted jobs wait one more `timeout` for the new
        socket's Welcome to resume them (then they fail too)."""
        exc = unavailable(self.endpoint, self.timeout, self.curve)
        calls, self.calls = self.calls, []
        for call in calls:
            if call.future is not None and not call.future.done():
                call.future.set_exception(exc)
        for req_id, stream in list(self.streams.items()):
            if stream.deadline is None and self.session is not None:
                stream.resuming, stream.deadline = True, now + self.timeout
            else:
                del self.streams[req_id]
                stream.sink.put_nowait(exc)
        if self.session is None and self.held:
            self.held = set()
            if self.injected is not None:
                self.injected.put_nowait(exc)
        self._hello_due = True
        self.last_rx = self.last_tx = now
        return exc

    def abort_frames(self) -> list[bytes]:
        """Aborts for the accepted jobs still streaming and the injected ones still held
        (sent when the client closes)."""
        ids = [s.job_id for s in self.streams.values() if s.job_id] + sorted(self.held)
        return [self.encode(P.Abort(job_id=j)) for j in ids]


def _not_resumed(job_id: str | None, req_id: str, dropped: bool) -> RequestError:
    """Why a stream did not resume: its result dropped, or the session gone."""
    if dropped:
        return RequestError(
            "result-dropped",
            f"job {job_id} finished while this client was away, but the daemon held too many "
            "results for absent clients to keep it (max_held_result_bytes)",
            req_id,
        )
    return RequestError(
        "lost",
        f"job {job_id} was lost while this client reconnected (the daemon restarted, or it "
        "forgot the session after client_timeout)",
        req_id,
    )
