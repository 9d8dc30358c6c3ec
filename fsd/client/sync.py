"""The sync client of the SDK: `Client` and the `JobHandle` of each submitted job.

    from fsd.client import Client

    with Client() as c:                          # tcp://127.0.0.1:5557
        for chunk in c.generate("Hello", max_tokens=32):
            print(chunk.text, end="", flush=True)
        out = c.complete("Hi", max_tokens=8)     # Completion: text, timings, counts
        results = [h.result() for h in [c.submit(p) for p in prompts]]  # many at once
        c.retune(policy="fcfs"); c.status(); c.jobs()
        c.preview(policy="fcfs").proposed.p95   # what-if: the twin runs, nothing applied

Design: one I/O thread per `Client` owns the DEALER socket (`fsd.client.iothread`).
Callers hand it requests through a queue and wait on futures (control calls) or on
their job's queue (streams); routing, deadlines, heartbeats and the liveness probe
live in the socket-free `fsd.client.core.ClientCore`. Hence a `Client` is
thread-safe: threads may share one. A `JobHandle` belongs to one consuming thread.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import zmq

from fsd import protocol as P
from fsd.client.base import (
    DEFAULT_HEARTBEAT,
    DEFAULT_TIMEOUT,
    INJECT_CHECK_TIME,
    PREVIEW_TIME,
    Completion,
    build_inject,
    build_preview,
    build_submit,
)
from fsd.client.core import ClientCore, JobState, answered_by_id
from fsd.client.errors import RequestError, unavailable
from fsd.client.iothread import IOThread, Outgoing
from fsd.client.keys import CurveKeys
from fsd.errors import ConfigError, FsdError
from fsd.jobs import SamplingParams
from fsd.protocol_preview import DEFAULT_HORIZON, DEFAULT_SEEDS

_GRACE = 2.0  # beyond a call's own deadline, in case the I/O thread itself is stuck
_PROGRESS_EVERY = 1.0  # seconds: longest a waiting call's progress callback goes unheard


class JobHandle:
    """A submitted job: iterate it for `Chunk`s (text, token_ids, job_id) or wait for
    its `result()`. `job_id` blocks until the daemon accepts the job."""

    def __init__(self, client: Client, req_id: str, sink: queue.Queue) -> None:
        self._client = client
        self._sink = sink
        self._state = JobState(req_id)

    @property
    def req_id(self) -> str:
        return self._state.req_id

    @property
    def job_id(self) -> str:
        """The daemon's id for the job (waits for `Accepted`; raises its refusal)."""
        return self.accepted()

    @property
    def prompt_tokens(self) -> int | None:
        return self._state.prompt_tokens

    @property
    def done(self) -> bool:
        return self._state.done

    def accepted(self, timeout: float | None = None) -> str:
        state = self._state
        while state.job_id is None and not state.done:
            state.feed(self._get(timeout))
        if state.job_id is None:
            raise state.error  # type: ignore[misc]
        return state.job_id

    def __iter__(self) -> Iterator[P.Chunk]:
        state = self._state
        while True:
            while state.pending:
                yield state.pending.popleft()
            if state.done:
                if state.error is not None:
                    raise state.error
                return
            state.feed(self._get(None))

    def result(self, timeout: float | None = None) -> Completion:
        """The finished job (consumes the chunks not read yet)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        state = self._state
        while not state.done:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            state.feed(self._get(left, timeout))
        state.pending.clear()
        if state.error is not None:
            raise state.error
        assert state.result is not None
        return state.result

    def abort(self) -> dict[str, Any]:
        """Ask the daemon to stop this job; its result then ends with reason "abort"."""
        return self._client.abort(self.job_id)

    def _get(self, timeout: float | None, total: float | None = None) -> Any:
        try:
            return self._sink.get(timeout=timeout)
        except queue.Empty:
            waited = total if total is not None else timeout
            raise TimeoutError(f"job {self.req_id} gave no answer within {waited:g} s") from None


class Client:
    """Synchronous client of one fsd daemon (thread-safe; see the module doc).

    `timeout`: seconds to wait for any answer before `DaemonUnavailable`;
    `heartbeat`: seconds between `Ping`s while jobs are outstanding (default: a
    third of the daemon's default client_timeout); `curve`: `CurveKeys` when the
    daemon requires CURVE; `token`: the operator token, for the operator role
    (`fsd.credentials.find_operator_token` reads the daemon's token file).
    """

    def __init__(
        self,
        endpoint: str = P.DEFAULT_ENDPOINT,
        timeout: float = DEFAULT_TIMEOUT,
        curve: CurveKeys | None = None,
        heartbeat: float | None = None,
        token: str | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        self.endpoint = endpoint
        self.timeout = timeout
        self._core = ClientCore(
            endpoint,
            timeout,
            heartbeat or DEFAULT_HEARTBEAT,
            curve=curve is not None,
            token=token,
        )
        self._injected: queue.Queue[Any] = queue.Queue()  # injected jobs' Finished
        self._finished_injected: dict[str, P.Finished] = {}
        self._core.injected = self._injected
        keys = curve.resolve() if curve is not None else None
        self._io = IOThread(self._core, context or zmq.Context.instance(), endpoint, keys)

    # ---- generation --------------------------------------------------------------

    def submit(
        self,
        prompt: str | Sequence[int],
        *,
        tags: Sequence[str] = (),
        params: SamplingParams | None = None,
        **sampling: Any,
    ) -> JobHandle:
        """Send one job without waiting; sampling keywords as `fsd.SamplingParams`."""
        req_id = self._core.next_req_id()
        msg = build_submit(req_id, prompt, params, sampling, tags)
        sink: queue.Queue[Any] = queue.Queue()
        self._io.put(Outgoing(self._core.encode(msg), req_id=req_id, sink=sink))
        return JobHandle(self, req_id, sink)

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        tags: Sequence[str] = (),
        params: SamplingParams | None = None,
        **sampling: Any,
    ) -> JobHandle:
        """Stream a job: iterate the handle for chunks; `.result()` once it ends."""
        return self.submit(prompt, tags=tags, params=params, **sampling)

    def complete(
        self,
        prompt: str | Sequence[int],
        *,
        tags: Sequence[str] = (),
        params: SamplingParams | None = None,
        **sampling: Any,
    ) -> Completion:
        """Run one job to its end and return the whole result."""
        return self.submit(prompt, tags=tags, params=params, **sampling).result()

    # ---- control -----------------------------------------------------------------

    def abort(self, job_id: str) -> dict[str, Any]:
        return self._call(P.Abort(job_id=job_id), "ack:abort").detail

    def retune(self, **changes: Any) -> dict[str, Any]:
        """Change scheduling settings live; returns the daemon's resulting config."""
        if not changes:
            raise ConfigError("retune needs at least one setting, e.g. policy='fcfs'")
        detail = self._call(P.Retune(changes=changes), "ack:retune").detail
        return detail.get("config", detail)

    def preview(
        self, horizon: float = DEFAULT_HORIZON, seeds: int = DEFAULT_SEEDS, **changes: Any
    ) -> P.PreviewReply:
        """What would `changes` (retune's keys) do over the next `horizon` seconds?

        The daemon runs its twin from a snapshot of the live state, `seeds` times under
        the current settings and under `changes`; nothing is applied. Takes seconds to a
        minute; RequestError "overloaded" while another preview runs.
        """
        msg = build_preview(changes, horizon, seeds, self._core.next_req_id())
        return self._call(msg, "preview", PREVIEW_TIME)

    def inject(
        self,
        burst: P.Burst | Sequence[int] | dict[str, int] | None = None,
        scenario: str | Path | None = None,
        tag: str = "injected",
    ) -> list[str]:
        """Inject tagged jobs: `burst=(count, input_len, output_len)` or a scenario
        (a file path or TOML text, read by the daemon). Returns their job ids."""
        msg = build_inject(burst, scenario, tag, self._core.next_req_id())
        reply = self._call(msg, "ack:inject", INJECT_CHECK_TIME)
        return list(reply.detail.get("job_ids", []))

    def wait_injected(
        self,
        job_ids: Sequence[str],
        timeout: float | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, P.Finished]:
        """Wait until each of `job_ids` (from `inject`) has finished; their `Finished`.

        The daemon sends no tokens for injected jobs, only their end; this client
        heartbeats meanwhile so that they are not reaped. TimeoutError after `timeout`.
        `on_progress(finished, total)` is called as they end and at least every second
        (a progress bar's clock).
        """
        want = set(job_ids)
        got = {
            j: self._finished_injected.pop(j) for j in list(want) if j in self._finished_injected
        }
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(got) < len(want):
            if on_progress is not None:
                on_progress(len(got), len(want))
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"{len(want) - len(got)} injected jobs still running")
            wait = left if on_progress is None else min(left or _PROGRESS_EVERY, _PROGRESS_EVERY)
            try:
                item = self._injected.get(timeout=wait)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            if item.job_id in want:
                got[item.job_id] = item
            else:
                self._finished_injected[item.job_id] = item
        if on_progress is not None:
            on_progress(len(got), len(want))
        return got

    def jobs(self) -> list[P.JobInfo]:
        return self._call(P.ListJobs(), "jobs").jobs

    def job(self, job_id: str) -> P.JobInfo:
        return self._call(P.GetJob(job_id=job_id), "job").job

    def status(self) -> P.StatusReply:
        return self._call(P.Status(), "status")

    def drain(self, timeout: float = 30.0) -> dict[str, Any]:
        """Stop new jobs; returns once the daemon says in-flight jobs ended (or `timeout`)."""
        return self._call(P.Drain(timeout=timeout), "ack:drain", timeout, deferred=True).detail

    def undrain(self) -> dict[str, Any]:
        """Accept new jobs again after a drain (operator)."""
        return self._call(P.Undrain(), "ack:undrain").detail

    def shutdown(self, drain: bool = True, timeout: float = 30.0) -> dict[str, Any]:
        msg = P.Shutdown(drain=drain, timeout=timeout)
        return self._call(msg, "ack:shutdown", timeout, deferred=True).detail

    def _call(self, msg: P.Request, key: str, extra: float = 0.0, deferred: bool = False) -> Any:
        fut: Future[Any] = Future()
        frame = self._core.encode(msg)
        call_id = answered_by_id(msg)
        self._io.put(
            Outgoing(frame, sink=fut, key=key, extra=extra, deferred=deferred, call_id=call_id)
        )
        try:
            reply = fut.result(timeout=self.timeout + extra + _GRACE)
        except FsdError:  # DaemonUnavailable (also a TimeoutError) or the client closed
            raise
        except TimeoutError:
            raise unavailable(self.endpoint, self.timeout) from None
        if isinstance(reply, P.Error):
            raise RequestError(reply.code, reply.message, reply.req_id)
        return reply

    # ---- life --------------------------------------------------------------------

    def close(self) -> None:
        """Abort this client's streaming jobs and stop the I/O thread."""
        self._io.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
