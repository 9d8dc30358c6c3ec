"""Scenario injection inside the daemon: check off the engine thread, then feed jobs.

`Inject(scenario=TEXT, traces={name: CSV})` carries everything inline: the daemon
never opens a path a client names (a path could name a secret, a FIFO that blocks,
or resolve against the daemon's working folder). Parsing and expanding a scenario
with a large trace takes long enough to stall iterations, so it runs on a worker
thread against a frozen copy of the engine's limits; the engine thread only starts
the feed and answers the client once that is done (`pump`). The whole scenario is
checked before anything changes: its syntax, that every job fits this engine, and
that every retune names valid settings; a refusal is one `Error` naming the field.

An accepted scenario becomes a `TimelineFeed` owned by the injecting connection: its jobs
are that client's (reaped with it, each answered by a `Finished`), admitted under the
same per-client and daemon-wide job caps as submitted ones. Every planned job id
gets exactly one `Finished`, also when it is skipped or dropped by a drain, so a
client can count its injection down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from fsd import protocol as P
from fsd.admission import RequestLimits, check_open, check_request
from fsd.config import CacheConfig, SchedConfig
from fsd.engine.face_protocol import Face
from fsd.engine.output import RequestOutput
from fsd.errors import (
    ConfigError,
    FsdError,
    OverloadedError,
    PromptTooLongError,
    SettingError,
    UnknownJobError,
)
from fsd.sched.retune import plan_retune
from fsd.server.audit import audit, settings
from fsd.server.loop.job_admission import Admission, synthetic_ask
from fsd.server.roles import Caller
from fsd.workload.feed import TimelineFeed
from fsd.workload.scenario import INLINE, Scenario, parse_scenario
from fsd.workload.timeline import Action, Timeline, expand

log = logging.getLogger("fsd.server")

MAX_SCENARIO_JOBS = 100_000  # arrivals one injected scenario may plan
MAX_PENDING = 2  # scenarios being checked at once; more are refused (busy)
SOURCE = INLINE  # how errors name an injected scenario


@dataclass(frozen=True)
class Limits:
    """What a scenario is checked against: a frozen copy of the engine's limits."""

    request: RequestLimits  # what bounds one job (fsd.admission)
    sched: SchedConfig  # the settings a scripted retune changes
    cache: CacheConfig


@dataclass
class _Owned:
    """A running feed and who asked for it."""

    feed: TimelineFeed
    rng: np.random.Generator  # the prompts' tokens
    owner: Caller


@dataclass
class _Pending:
    future: Future[tuple[Scenario, Timeline]]
    owner: Caller
    tag: str
    req_id: str | None


class ScenarioInjector:
    """The daemon's running scenario feeds and the ones being checked."""

    def __init__(
        self,
        face: Face,
        admission: Admission,
        send: Callable[[bytes | None, P.Reply], None],
        send_error: Callable[[bytes, BaseException, str | None], None],
        finished: Callable[[RequestOutput], None],
        connected: Callable[[bytes], bool],
    ) -> None:
        """`connected(ident)`: whether that client is still known (else its check's
        answer has no one to go to)."""
        self.face = face
        self.admission = admission
        self.send = send
        self.send_error = send_error
        self.finished = finished
        self.connected = connected
        self.feeds: list[_Owned] = []
        self.pending: list[_Pending] = []
        self._pool: ThreadPoolExecutor | None = None
        self._count = 0

    # ---- accepting -------------------------------------------------------------

    def submit(self, caller: Caller, msg: P.Inject) -> None:
        """Start checking an inline scenario; `pump` answers once it is done."""
        text = msg.scenario or ""
        if len(text.encode()) > P.MAX_SCENARIO_BYTES:
            raise ConfigError(f"scenario: more than {P.MAX_SCENARIO_BYTES} bytes")
        size = sum(len(t.encode()) for t in msg.traces.values())
        if size > P.MAX_TRACE_BYTES:
            raise ConfigError(f"traces: {size} bytes, more than {P.MAX_TRACE_BYTES}")
        if len(self.pending) >= MAX_PENDING:
            raise OverloadedError(
                f"{len(self.pending)} scenarios are being checked; inject again when they are"
            )
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsd-inject")
        future = self._pool.submit(prepare, text, dict(msg.traces), self.limits())
        self.pending.append(_Pending(future, caller, msg.tag, msg.req_id))

    def limits(self) -> Limits:
        face = self.face
        return Limits(face.limits, face.config.sched, face.config.cache)

    def _start(self, p: _Pending, scenario: Scenario, timeline: Timeline, now: float) -> None:
        self._count += 1
        feed = TimelineFeed(timeline, now, prefix=f"{p.tag}-s{self._count}-", tag=p.tag)
        self.feeds.append(_Owned(feed, np.random.default_rng(self._count), p.owner))
        audit(
            p.owner,
            "inject",
            f"scenario {scenario.name}: {len(timeline.arrivals)} jobs and "
            f"{len(timeline.actions)} actions over {timeline.duration:.1f} s, tag {p.tag}",
        )
        detail = {
            "job_ids": feed.job_ids,
            "scenario": scenario.name,
            "duration": timeline.duration,
            "actions": len(timeline.actions),
        }
        self.send(p.owner.ident, P.Ack(what="inject", detail=detail, req_id=p.req_id))

    # ---- the loop's turn -------------------------------------------------------

    def next_due(self) -> float | None:
        """Wall time of the earliest pending step of any feed (soon, while checking)."""
        times = [t for o in self.feeds if (t := o.feed.next_time()) is not None]
        if self.pending:
            times.append(time.time() + 0.02)
        return min(times) if times else None

    def pump(self, now: float) -> None:
        """Answer finished checks; take every step that is due; stop all when draining."""
        if self.pending:
            self._answer_checks(now)
        if not self.feeds:
            return
        if self.admission.draining():
            for owned in self.feeds:
                self._drop(owned, "the daemon is draining")
            self.feeds = []
            return
        keep = []
        for owned in self.feeds:
            feed = owned.feed
            try:
                for when, job_id, step in feed.due(now):
                    if isinstance(step, Action):
                        self._act(owned, step)
                    elif job_id is not None:
                        self._admit(owned, job_id, step.prompt_len, step.output_len, when)
            except Exception:  # noqa: BLE001 - a scenario must never stop the daemon
                log.exception("scenario %s failed; its remaining steps are dropped", feed.prefix)
                self._drop(owned, "the scenario failed (see the daemon's log)")
                continue
            if not feed.done:
                keep.append(owned)
        self.feeds = keep

    def _answer_checks(self, now: float) -> None:
        keep = []
        for p in self.pending:
            if not p.future.done():
                keep.append(p)
                continue
            try:
                scenario, timeline = p.future.result()
            except FsdError as exc:
                self.send_error(p.owner.ident, exc, p.req_id)
                continue
            except Exception as exc:  # noqa: BLE001 - a bug in checking is the client's Error
                log.exception("checking an injected scenario failed")
                self.send_error(p.owner.ident, exc, p.req_id)
                continue
            try:
                check_open(self.admission.draining())
            except FsdError as exc:
                self.send_error(p.owner.ident, exc, p.req_id)
                continue
            if not self.connected(p.owner.ident):
                continue  # the client went away while we checked
            self._start(p, scenario, timeline, now)
        self.pending = keep

    def cancel(self, ident: bytes) -> None:
        """Stop the feeds and checks of a client that went away."""
        self.feeds = [o for o in self.feeds if o.owner.ident != ident]
        self.pending = [p for p in self.pending if p.owner.ident != ident]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- steps -----------------------------------------------------------------

    def _admit(
        self, owned: _Owned, job_id: str, prompt_len: int, output_len: int, when: float
    ) -> None:
        feed = owned.feed
        vocab = self.face.info.vocab_size
        request = synthetic_ask(owned.rng, vocab, prompt_len, output_len, feed.tag, job_id, when)
        try:
            self.admission.admit(owned.owner, [request], stream=False)
        except FsdError as exc:  # checked up front; a retune or the caps may refuse it now
            log.warning("scenario job %s not admitted: %s", job_id, exc)
            self.send(owned.owner.ident, not_run(job_id, f"not admitted: {exc}"))

    def _drop(self, owned: _Owned, why: str) -> None:
        """End a feed early: every planned job not yet admitted is answered."""
        log.info("%s: %d steps of scenario %s dropped", why, owned.feed.pending, owned.feed.prefix)
        for job_id in owned.feed.unstarted_ids():
            self.send(owned.owner.ident, not_run(job_id, why))

    def _act(self, owned: _Owned, action: Action) -> None:
        if action.kind == "retune":
            try:
                self.face.retune(**action.changes)
            except (ConfigError, TypeError) as exc:
                log.warning("scenario retune %s refused: %s", action.changes, exc)
                return
            audit(
                owned.owner, "retune", f"{settings(action.changes)} (scenario {owned.feed.prefix})"
            )
            return
        aborted = 0
        for job_id in owned.feed.started_ids():
            try:
                self.finished(self.face.abort(job_id))
                aborted += 1
            except UnknownJobError:
                pass  # finished already
        log.info("scenario abort-all: %d jobs of %s aborted", aborted, owned.feed.prefix)


def not_run(job_id: str, why: str) -> P.Finished:
    """The `Finished` of a planned job that never ran (so the client can count it)."""
    return P.Finished(
        req_id=job_id,
        job_id=job_id,
        reason="abort",
        text="",
        token_ids=[],
        timings=P.Timings(arrival=0.0),
        message=why,
    )


# ---- checks (pure: they run on the worker thread) ------------------------------------


def prepare(text: str, traces: Mapping[str, str], limits: Limits) -> tuple[Scenario, Timeline]:
    """Parse, expand and check an injected scenario; ConfigError names what is wrong."""
    scenario = parse_scenario(text, SOURCE, None, traces=traces)
    timeline = expand(scenario)
    if len(timeline.arrivals) > MAX_SCENARIO_JOBS:
        raise ConfigError(
            f"{SOURCE}: the scenario plans {len(timeline.arrivals)} jobs, more than "
            f"{MAX_SCENARIO_JOBS}"
        )
    check_fits(limits, timeline, scenario.source)
    for action in timeline.actions:
        if action.kind == "retune":
            check_retune(limits, action, scenario.source)
    return scenario, timeline


def check_fits(limits: Limits, timeline: Timeline, source: str) -> None:
    """Refuse a scenario with a job this engine could never run (named with its origin)."""
    for k, a in enumerate(timeline.arrivals):
        try:
            check_request(a.prompt_len, a.output_len, limits.request)
        except PromptTooLongError as exc:
            raise ConfigError(f"{source}: {a.origin}: job {k}: {exc}") from None


def check_retune(limits: Limits, action: Action, source: str) -> None:
    """Validate a retune's settings the way `Engine.retune` will, without applying them."""
    try:
        plan_retune(limits.sched, limits.cache, action.changes)
    except SettingError as exc:
        # a scenario with a bad retune is an invalid scenario: refused as a whole
        raise ConfigError(f"{source}: retune at {action.time:g} s: set: {exc}") from None
