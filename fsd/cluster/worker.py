"""One replica's engine on a thread of its own: it steps while it has work and applies
the daemon's commands between two steps, so the daemon never waits for a step.

Design. A replica lives in a Ray actor (or in process: tests, and one machine without
Ray). Its thread owns the engine (`EngineFace`); the daemon reaches it through three
doors, each safe from any thread:
- `admit`: fire and forget. The daemon has already admitted the request
  (`fsd.admission`: tokenized and checked once, which this engine trusts) and named
  the job, so it answers its client at once; a refusal here (a late job refused, a
  degraded engine) comes back in a report and the daemon ends the job with that error;
- `tell`: a verb without an answer (abort), queued like an admission;
- `call`: a verb whose answer the daemon needs (retune, the twin's history, a move),
  applied between two steps: it waits at most one step;
- `poll`: what the steps produced since the last poll (tokens and results,
  iterations, failures, engine events), what the router reads (`state`), and the
  replica's snapshot with its job table and level counts (`view`), built at most
  every `VIEW_EVERY` seconds and soon after its set of jobs changed: the daemon answers
  status, job lists and telemetry from the views replicas pushed, never waiting for a
  replica's step (a hung replica would hold every client).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from fsd.admission import JobRequest, RequestLimits
from fsd.config import EngineConfig
from fsd.cost import CostModel
from fsd.engine.core import Engine
from fsd.engine.events import EngineEvent
from fsd.engine.face import EngineFace
from fsd.engine.output import IterationStats, StepDelta
from fsd.engine.views import EngineInfo, EngineSnapshot
from fsd.errors import FsdError
from fsd.twin.snapshot import take_snapshot

log = logging.getLogger("fsd.cluster")
IDLE_WAIT = 0.05  # seconds an idle replica waits for a command before looking again
VIEW_EVERY = 0.1  # seconds between two views a busy replica pushes (at least)
VIEW_IDLE = 0.5  # ... and an idle one (a fresh replica reads "up" at once)
VIEW_CHANGED = 0.03  # ... and one whose jobs changed: soon, but not a whole table per step


class ReplicaDown(FsdError):
    """A replica has stopped (its actor, process or thread is gone)."""

    code = "replica-down"


@dataclass
class Refusal:
    """An admission the replica refused after the daemon accepted it."""

    job_id: str
    code: str  # the error's stable code (fsd.errors), e.g. "overloaded"
    message: str


@dataclass
class Report:
    """What one replica did since the last poll (plain values: it crosses processes)."""

    index: int
    deltas: list[StepDelta] = field(default_factory=list)
    iterations: list[IterationStats] = field(default_factory=list)
    seconds: float = 0.0  # wall time in steps
    failures: list[str] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)
    busy: bool = False  # it still has work
    live: int = 0  # its live jobs
    state: Any = None  # the router's view of it (fsd.router), when one is given
    view: View | None = None  # its latest snapshot (module doc), when one was built
    down: str | None = None  # set by the daemon's side: the replica is gone, and why


@dataclass
class View:
    """A replica's observable state as of `snapshot.time`: the snapshot with its job
    table and the jobs' running/waiting counts per level."""

    snapshot: EngineSnapshot
    level_counts: dict[int, tuple[int, int]]


@dataclass(frozen=True)
class Fixed:
    """What a replica serves and its bounds: read once, they never change."""

    info: EngineInfo
    limits: RequestLimits
    config: EngineConfig
    cost: CostModel


class ReplicaWorker:
    """One engine and its loop thread (module doc). `routed` (seconds between pushes,
    0: every step; None: no router): after a step it builds its state for the router
    (fsd.router.state: queued work, KV room, prefix cache events), acknowledging the
    admissions it has taken;
    `news` is notified when a report has something (replicas in one process share it)."""

    def __init__(
        self,
        config: EngineConfig,
        index: int,
        routed: float | None = None,
        news: threading.Condition | None = None,
    ) -> None:
        self.index = index
        self.face = EngineFace(Engine(config), events=True, snapshot=take_snapshot)
        self._routed = routed
        self._pushed = 0.0  # when it last built a state (monotonic)
        self._watcher: Any = None  # its router state's builder (made on the first step)
        self._taken = 0  # admissions applied (the router counts them as acknowledged)
        self._viewed = -1.0  # when it last built a view (monotonic)
        self._changed = True  # its set of jobs changed since that view
        self._commands: queue.SimpleQueue[tuple[str, tuple, Future | None]] = queue.SimpleQueue()
        self._ready = news or threading.Condition()
        self._report = Report(index)
        # admissions received: a call waits for those sent before it (on Ray, calls may
        # arrive on the actor's threads out of order)
        self._received = 0
        self._arrived = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"fsd-replica-{index}", daemon=True)
        self._thread.start()

    # ---- the doors (any thread) ------------------------------------------------------

    def fixed(self) -> Fixed:
        return self.call("fixed")

    def admit(self, request: JobRequest) -> None:
        """Queue an admitted request (refusals come back in a report)."""
        self._check_open()
        with self._arrived:
            self._commands.put(("admit", (request,), None))
            self._received += 1
            self._arrived.notify_all()

    def tell(self, name: str, *args: Any) -> None:
        """Queue a verb whose answer nobody waits for (its error is logged)."""
        self._check_open()
        with self._arrived:
            self._commands.put((name, args, None))
            self._received += 1
            self._arrived.notify_all()

    def call(self, name: str, *args: Any, after: int = 0, timeout: float | None = None) -> Any:
        """Run a verb between two steps, after the first `after` admissions, and return
        its answer (its error is raised)."""
        self._check_open()
        with self._arrived:
            if not self._arrived.wait_for(lambda: self._received >= after, timeout):
                raise FsdError(f"replica {self.index}: admissions before this call never came")
            future: Future = Future()
            self._commands.put((name, args, future))
        return future.result(timeout)

    def poll(self, timeout: float = 0.0) -> Report:
        """What happened since the last poll, waiting up to `timeout` for anything."""
        self._check_open()
        with self._ready:
            if timeout > 0 and not self.has_news():
                self._ready.wait(timeout)
            report, self._report = self._report, Report(self.index)
        report.busy = self.face.busy() or not self._commands.empty()
        report.live = self.face.live()
        return report

    def _check_open(self) -> None:
        if self._closed:
            raise ReplicaDown(f"replica {self.index} has stopped")

    def close(self, wait: float = 10.0) -> None:
        """Stop it; `wait`: how long for its thread (0: a hung one is left behind)."""
        if self._closed:
            return
        self._closed = True
        self._commands.put(("stop", (), None))
        self._thread.join(wait)
        while not self._commands.empty():  # calls that came too late hear why
            _, _, future = self._commands.get_nowait()
            if future is not None:
                future.set_exception(ReplicaDown(f"replica {self.index} has stopped"))
        self.face.close()

    # ---- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            try:
                self._apply(block=not self.face.busy())
                if self.face.busy():
                    self._step()
                self._view()
            except Exception:  # noqa: BLE001 - a replica's loop must not die
                log.exception("replica %d: the loop failed", self.index)
                time.sleep(IDLE_WAIT)

    def _apply(self, block: bool) -> None:
        """Every queued command; an idle replica waits a little for the first."""
        try:
            item = self._commands.get(timeout=IDLE_WAIT) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._command(*item)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return

    def _command(self, name: str, args: tuple, future: Future | None) -> None:
        if name == "stop":
            return
        if name == "admit":
            self._admit(*args)
            return
        self._changed = True
        if future is None:  # told: nobody waits for the answer
            try:
                self._verb(name)(*args)
            except FsdError as exc:
                log.debug("replica %d: %s %s: %s", self.index, name, args, exc)
            return
        try:
            future.set_result(self._verb(name)(*args))
        except BaseException as exc:  # noqa: BLE001 - the caller gets it
            future.set_exception(exc)

    def _verb(self, name: str) -> Callable[..., Any]:
        face = self.face
        verbs: dict[str, Callable[..., Any]] = {
            "fixed": lambda: Fixed(face.info, face.limits, face.config, face.cost),
            "abort": face.abort,
            "retune": lambda changes: face.retune(**changes),
            "snapshot": face.snapshot,
            "jobs": face.jobs,
            "level_counts": face.level_counts,
            "job": face.job,
            "has": face.has,
            "history": face.history,
            "config": lambda: face.config,
            "view": lambda: View(face.snapshot(time.time()), face.level_counts()),
            "take_out": face.take_out,
            "resync": lambda: self._watcher is not None and self._watcher.resync(),
            "bring_in": face.bring_in,
        }
        if name not in verbs:
            raise FsdError(f"no replica verb {name!r}")
        return verbs[name]

    def _admit(self, request: JobRequest) -> None:
        """Queue it as admitted by the daemon (the engine trusts it: fsd.admission)."""
        self._taken += 1
        self._changed = True
        try:
            self.face.admit(request)
        except FsdError as exc:
            self._add(refused=[Refusal(request.job_id or "", exc.code, str(exc))])

    def _step(self) -> None:
        stepped = self.face.step()
        if any(d.finished for d in stepped.deltas):
            self._changed = True
        failures = [f"{what}: {type(exc).__name__}: {exc}" for what, exc in stepped.failures]
        state, now = None, time.monotonic()
        if self._routed is not None and now - self._pushed >= self._routed:
            self._watcher, state = self.face.routing_state(self._watcher, self.index, self._taken)
            self._pushed = now
        self._add(
            deltas=stepped.deltas,
            iterations=stepped.iterations,
            seconds=stepped.seconds,
            failures=failures,
            events=self.face.drain_events(),
            state=state,
        )

    def _view(self) -> None:
        """Push a view when the jobs changed or it is due (module doc)."""
        now = time.monotonic()
        due = VIEW_EVERY if self.face.busy() else VIEW_IDLE
        if now - self._viewed < (VIEW_CHANGED if self._changed else due):
            return
        self._viewed, self._changed = now, False
        view = View(self.face.snapshot(time.time()), self.face.level_counts())
        self._add(view=view)

    def _add(
        self, seconds: float = 0.0, state: Any = None, view: View | None = None, **lists: list
    ) -> None:
        with self._ready:
            report = self._report
            for name, items in lists.items():
                getattr(report, name).extend(items)
            report.seconds += seconds
            if state is not None:
                report.state = state
            if view is not None:
                report.view = view
            self._ready.notify_all()

    def has_news(self) -> bool:
        """Whether the next report carries tokens, refusals or failures (hold `news`)."""
        r = self._report
        return bool(r.deltas or r.refused or r.failures or r.iterations)
