"""Previews in the daemon: snapshot on the engine thread, simulate in another process.

Design. The engine thread only checks the request (with the retune's own rule, so a
preview is refused in the words a retune would be) and freezes the scheduler
(fsd.twin.snapshot: one pickling pass, milliseconds); the runs go to a worker
process. A process, not a thread: the simulator is pure Python, and a thread would
take the GIL from the engine thread between its every torch call. The worker is
started with `spawn` (the daemon has threads; forking it is unsafe), asks for one
BLAS thread and the idle CPU priority (`fsd.twin.worker`) so the engine's threads
come first on a busy machine, and is kept for the next preview. One preview runs at
a time; another is refused ("overloaded") until it ends. `pump` answers from the
engine loop when the runs are done; a worker that dies is answered as an error and
replaced on the next preview.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from fsd import protocol as P
from fsd.engine.face_protocol import Face
from fsd.errors import ConfigError, OverloadedError, SettingError
from fsd.protocol_preview import MAX_HORIZON, MAX_SEEDS
from fsd.sched.retune import plan_retune
from fsd.server.roles import Caller
from fsd.twin.forward import preview
from fsd.twin.worker import setup_worker

log = logging.getLogger("fsd.server")

MAX_REQ_ID = 256


@dataclass
class _Running:
    future: Future[P.PreviewReply]
    caller: Caller
    req_id: str | None
    started: float


def check_preview(msg: P.Preview, sched: Any, cache: Any) -> dict[str, Any]:
    """The changes a preview may run, or SettingError: retune's rule, plus the horizon,
    the seeds and the request id."""
    if msg.req_id is not None and not 1 <= len(msg.req_id) <= MAX_REQ_ID:
        raise ConfigError(f"req_id must be 1 to {MAX_REQ_ID} characters")
    if not msg.changes:
        raise SettingError("preview needs at least one setting to change, e.g. policy=fcfs")
    h = msg.horizon
    if isinstance(h, bool) or not isinstance(h, int | float) or not 0 < h <= MAX_HORIZON:
        raise SettingError(f"horizon must be in (0, {MAX_HORIZON:g}] seconds, got {h!r}")
    n = msg.seeds
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SEEDS:
        raise SettingError(f"seeds must be an integer in [1, {MAX_SEEDS}], got {n!r}")
    changes = {k: tuple(v) if isinstance(v, list) else v for k, v in msg.changes.items()}
    plan_retune(sched, cache, changes)  # SettingError in retune's words
    return changes


class PreviewRunner:
    """The daemon's one running preview and its worker process."""

    def __init__(
        self, face: Face, send: Callable[[bytes | None, P.Reply], None], slo: float
    ) -> None:
        """`slo`: the per-token latency target previews score against (seconds)."""
        self.face = face
        self.send = send
        self.slo = slo
        self.running: _Running | None = None
        self._pool: ProcessPoolExecutor | None = None
        self.seconds = 0.0  # engine-thread time spent on previews (checks and snapshots)

    def submit(self, caller: Caller, msg: P.Preview) -> None:
        """Check, snapshot and start one preview; `pump` answers when it is done."""
        t_start = time.perf_counter()
        try:
            self._submit(caller, msg)
        finally:
            self.seconds += time.perf_counter() - t_start

    def _submit(self, caller: Caller, msg: P.Preview) -> None:
        cfg = self.face.config
        changes = check_preview(msg, cfg.sched, cfg.cache)
        if self.running is not None:
            age = time.time() - self.running.started
            raise OverloadedError(
                f"a preview is already running (for {age:.0f} s); ask again when it ends"
            )
        snap = self.face.history(self.slo)
        future = self._executor().submit(preview, snap, changes, float(msg.horizon), msg.seeds)
        self.running = _Running(future, caller, msg.req_id, time.time())

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=setup_worker)
        return self._pool

    def pump(self) -> None:
        """Answer the preview if its runs are done (the engine loop calls this)."""
        run = self.running
        if run is None or not run.future.done():
            return
        self.running = None
        try:
            reply = run.future.result()
        except BrokenProcessPool:
            self._pool = None  # replaced on the next preview
            self._error(run, "the preview's worker process died; nothing was applied")
            return
        except Exception as exc:  # noqa: BLE001 - one preview's failure is its own
            log.exception("a preview failed")
            self._error(run, f"the preview failed: {type(exc).__name__}: {exc}")
            return
        reply.req_id = run.req_id
        self.send(run.caller.ident, reply)

    def _error(self, run: _Running, message: str) -> None:
        self.send(
            run.caller.ident, P.Error(code="preview-failed", message=message, req_id=run.req_id)
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
