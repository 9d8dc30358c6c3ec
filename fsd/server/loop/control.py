"""Answers each request type: submit, abort, retune, preview, inject, jobs, status, drain...

Every handler takes the `Caller` (connection, role, CURVE key) and the decoded
message; the operator-only requests were already checked by the service
(`fsd.server.roles`). A refusal is an `FsdError`, which the service turns into an
`Error` reply with a stable code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from fsd import protocol as P
from fsd.admission import JobRequest, check_request
from fsd.config import ServerConfig
from fsd.engine.face_protocol import Face
from fsd.engine.output import RequestOutput
from fsd.errors import (
    ConfigError,
    ForbiddenError,
    SettingError,
    UnknownJobError,
)
from fsd.printable import check_name
from fsd.server.audit import audit, settings
from fsd.server.loop.clients import ClientBook
from fsd.server.loop.injector import ScenarioInjector
from fsd.server.loop.job_admission import Admission, synthetic_ask
from fsd.server.loop.preview import PreviewRunner
from fsd.server.roles import OPERATOR, Caller

MAX_REQ_ID = 256  # characters of a client's request id
MAX_TAGS = 16
MAX_TAG = 64  # characters of one tag

Send = Callable[[bytes | None, P.Reply], None]


class Life(Protocol):
    """The daemon's own state that requests change: draining, stopping, its status."""

    draining: bool

    def begin_drain(self, ident: bytes | None, timeout: float) -> None: ...

    def end_drain(self) -> None: ...

    def begin_shutdown(self, drain: bool, timeout: float) -> None: ...

    def status(self, role: str = "client") -> P.StatusReply: ...


class ControlHandler:
    """Turns decoded requests into engine calls and replies."""

    def __init__(
        self,
        face: Face,
        send: Send,
        book: ClientBook,
        admission: Admission,
        life: Life,
        cfg: ServerConfig,
        finished: Callable[[RequestOutput], None],
        scenarios: ScenarioInjector,
        previews: PreviewRunner,
    ) -> None:
        self.face = face
        self.send = send
        self.book = book
        self.admission = admission
        self.life = life
        self.cfg = cfg
        self.finished = finished
        self._rng = np.random.default_rng(0)  # burst prompts
        self._listed: P.JobList | None = None  # the last ListJobs answer (`on_listjobs`)
        self.scenarios = scenarios
        self.previews = previews

    def dispatch(self, caller: Caller, msg: P.Request) -> None:
        handler = getattr(self, f"on_{type(msg).__name__.lower()}")
        handler(caller, msg)

    # ---- jobs ------------------------------------------------------------------

    def on_submit(self, caller: Caller, msg: P.Submit) -> None:
        self.admission.check_open()  # first: a draining daemon says so whatever is sent
        check_label("req_id", msg.req_id, MAX_REQ_ID)
        if msg.req_id in self.book.clients[caller.ident].req_ids:
            # not tied to the req_id's stream as an ordinary Error would be: the live
            # job keeps streaming (clients route this code to the refused submit only)
            self.send(
                caller.ident,
                P.Error(
                    code="duplicate-req-id",
                    message=f"req_id {msg.req_id!r} is already in flight on this connection; "
                    "this submit was refused, the job already running goes on",
                    req_id=msg.req_id,
                ),
            )
            return
        if (msg.prompt is None) == (msg.prompt_token_ids is None):
            raise ConfigError("give exactly one of prompt and prompt_token_ids")
        check_tags(msg.tags)
        if msg.affinity is not None:
            check_label("affinity", msg.affinity, P.MAX_AFFINITY_CHARS)
        prompt = msg.prompt if msg.prompt is not None else msg.prompt_token_ids
        # a client's max_tokens past the context is refused, naming the limit (HTTP too)
        request = JobRequest(
            prompt,  # type: ignore[arg-type]
            msg.sampling.params(),
            tags=msg.tags,
            clip=False,
            affinity=msg.affinity,
            req_id=msg.req_id,
        )
        [job] = self.admission.take(caller.relayed(msg.owner), [request])
        self.send(
            caller.ident,
            P.Accepted(
                req_id=msg.req_id,
                job_id=job.job_id,
                prompt_tokens=job.prompt_tokens,
                client_timeout=self.cfg.client_timeout,
            ),
        )

    def on_abort(self, caller: Caller, msg: P.Abort) -> None:
        if not self.face.has(msg.job_id):
            raise UnknownJobError(f"no job with id {msg.job_id!r}")
        if caller.role != OPERATOR and not caller.owns(self.book.owner_of(msg.job_id)):
            raise ForbiddenError(
                f"job {msg.job_id!r} is not this client's; aborting another client's job "
                "needs the operator role"
            )
        out = self.face.abort(msg.job_id)  # UnknownJobError -> Error unknown-job
        audit(caller, "abort", f"job {msg.job_id} at {len(out.token_ids)} output tokens")
        self.finished(out)
        self.send(
            caller.ident,
            P.Ack(what="abort", detail={"job_id": msg.job_id, "tokens": len(out.token_ids)}),
        )

    def on_inject(self, caller: Caller, msg: P.Inject) -> None:
        self.admission.check_open()
        check_label("tag", msg.tag, MAX_TAG)
        if msg.scenario is not None:
            if msg.burst is not None:
                raise ConfigError("inject takes a burst or a scenario, not both")
            self.scenarios.submit(caller, msg)  # answered once checked, off this thread
            return
        if msg.traces:
            raise ConfigError("traces come with a scenario")
        if msg.burst is None:
            raise ConfigError("inject needs a burst (count, input_len, output_len) or a scenario")
        b = msg.burst
        cap = self.cfg.max_burst
        if not 1 <= b.count <= cap:
            raise ConfigError(f"burst count must be in [1, {cap}] (max_burst), got {b.count}")
        if b.input_len < 1 or b.output_len < 1:
            raise ConfigError(f"burst lengths must be >= 1, got {b.input_len} and {b.output_len}")
        check_request(b.input_len, b.output_len, self.face.limits)  # before the prompts
        self.book.check_room(caller, b.count, self.face.live())  # before the prompts too
        vocab = self.face.info.vocab_size
        asks = [
            synthetic_ask(self._rng, vocab, b.input_len, b.output_len, msg.tag)
            for _ in range(b.count)
        ]
        ids = [job.job_id for job in self.admission.take(caller, asks, stream=False)]
        span = f"{ids[0]}..{ids[-1]}" if len(ids) > 1 else ids[0]
        detail = f"{b.count} jobs of {b.input_len}+{b.output_len} tokens, tag {msg.tag} ({span})"
        audit(caller, "inject", detail)
        self.send(caller.ident, P.Ack(what="inject", detail={"job_ids": ids}, req_id=msg.req_id))

    def on_listjobs(self, caller: Caller, msg: P.ListJobs) -> None:
        """One `JobList` per engine state (the face's rows are shared until it changes),
        which the Frontend encodes once for every asker."""
        rows = self.face.jobs(time.time())
        listed = self._listed
        if listed is None or listed.jobs is not rows:
            listed = self._listed = P.JobList(jobs=rows)
        self.send(caller.ident, listed)

    def on_getjob(self, caller: Caller, msg: P.GetJob) -> None:
        row = self.face.job(msg.job_id, time.time())
        if row is None:
            raise UnknownJobError(f"no job with id {msg.job_id!r}")
        self.send(caller.ident, P.JobReply(job=row))

    # ---- settings and life -----------------------------------------------------

    def on_retune(self, caller: Caller, msg: P.Retune) -> None:
        changes: dict[str, Any] = dict(msg.changes)
        if isinstance(changes.get("quanta"), list):
            changes["quanta"] = tuple(changes["quanta"])
        try:
            config = self.face.retune(msg.replica, **changes)
        except SettingError:
            raise  # the service answers Error(code=exc.code), "invalid-setting"
        except (ConfigError, TypeError) as exc:  # any other refusal of a setting is one too
            raise SettingError(str(exc)) from None
        where = "" if msg.replica is None else f" on replica {msg.replica}"
        audit(caller, "retune", settings(changes) + where)
        self.send(caller.ident, P.Ack(what="retune", detail={"config": config.to_dict()}))

    def on_preview(self, caller: Caller, msg: P.Preview) -> None:
        """What-if: answered with a PreviewReply once the twin has run (fsd.server.loop.preview)."""
        self.previews.submit(caller, msg)

    def on_status(self, caller: Caller, msg: P.Status) -> None:
        self.send(caller.ident, self.life.status(caller.role))

    def on_drain(self, caller: Caller, msg: P.Drain) -> None:
        timeout = check_timeout(msg.timeout)
        if msg.replica is not None:  # its jobs move to the other replicas now
            detail = self.face.drain_replica(msg.replica)
            audit(caller, "drain", f"replica {msg.replica}: {detail['moved']} jobs moved, "
                  f"{detail['staying']} staying until they can")  # fmt: skip
            self.send(caller.ident, P.Ack(what="drain", detail=detail))
            return
        self.life.begin_drain(caller.ident, timeout)
        audit(caller, "drain", f"({self.face.live()} jobs live, timeout {timeout:g} s)")

    def on_undrain(self, caller: Caller, msg: P.Undrain) -> None:
        if msg.replica is not None:
            detail = self.face.undrain_replica(msg.replica)
            audit(caller, "undrain", f"replica {msg.replica}")
            self.send(caller.ident, P.Ack(what="undrain", detail=detail))
            return
        self.life.end_drain()
        audit(caller, "undrain")
        self.send(caller.ident, P.Ack(what="undrain", detail={"draining": False}))

    def on_shutdown(self, caller: Caller, msg: P.Shutdown) -> None:
        timeout = check_timeout(msg.timeout)
        how = f"draining up to {timeout:g} s" if msg.drain else "now"
        audit(caller, "shutdown", f"{how} ({self.face.live()} jobs live)")
        self.send(caller.ident, P.Ack(what="shutdown", detail={"drain": msg.drain}))
        self.life.begin_shutdown(msg.drain, timeout)

    def on_ping(self, caller: Caller, msg: P.Ping) -> None:
        """Heartbeat: receiving it already refreshed the client's clock."""


MAX_TIMEOUT = 86_400.0  # seconds: a drain or shutdown timeout of at most one day


def check_timeout(value: float) -> float:
    if not 0.0 <= value <= MAX_TIMEOUT:  # also refuses NaN
        raise ConfigError(f"timeout must be in [0, {MAX_TIMEOUT:g}] seconds, got {value}")
    return value


def check_tags(tags: list[str]) -> None:
    if len(tags) > MAX_TAGS or any(not t or len(t) > MAX_TAG for t in tags):
        raise ConfigError(f"tags: at most {MAX_TAGS}, each 1 to {MAX_TAG} characters")
    for i, tag in enumerate(tags, 1):
        check_name(f"tag {i}", tag)


def check_label(what: str, value: str, limit: int) -> None:
    """A client-chosen name: 1 to `limit` characters, printable (`fsd.printable`)."""
    if not value or len(value) > limit:
        raise ConfigError(f"{what} must be 1 to {limit} characters")
    check_name(what, value)
