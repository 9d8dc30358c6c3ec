"""The sync client of the SDK: `Client` and the `JobHandle` of each submitted job.

    from fsd.client import Client

    with Client() as c:                          # tcp://127.0.0.1:5557
        for chunk in c.generate("Hello", max_tokens=32):
            print(chunk.text, end="", flush=True)
        out = c.complete("Hi", max_tokens=8)     # Completion: text, timings, counts
        results = [h.result() for h in [c.submit(p) for p in prompts]]  # many at once
        c.retune(policy="fcfs"); c.status(); c.jobs()
        c.preview(policy="fcfs").proposed.p95   # what-if: the twin runs, nothing applied

Design: a thin layer over the asyncio client. Each `Client` runs one event loop on a
thread of its own (`_Loop`) and, on it, one `AsyncClient`, which owns the DEALER
socket, the routing, deadlines, heartbeats and the liveness probe. A method submits
the matching coroutine to that loop (`asyncio.run_coroutine_threadsafe`) and waits
for it up to the call's own deadline plus a grace; a `JobHandle` waits the same way
for its `AsyncJobHandle` to hold what it asks for (the job id, a chunk, the end).
Hence a `Client` is thread-safe: threads may share one. A `JobHandle` belongs to one
consuming thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import zmq
import zmq.asyncio

from fsd import protocol as P
from fsd.client.aio import AsyncClient, AsyncJobHandle
from fsd.client.base import (
    INJECT_CHECK_TIME,
    PREVIEW_TIME,
    ClientBase,
    Closes,
    Completion,
    log,
)
from fsd.client.core import ClientCore
from fsd.client.errors import unavailable
from fsd.client.job import JobView
from fsd.errors import FsdError

_GRACE = 2.0  # beyond a call's own deadline, in case the loop itself is stuck
_PROGRESS_EVERY = 1.0  # seconds: longest a waiting call's progress callback goes unheard
_CLOSE_WAIT = 5.0  # seconds close() waits for the AsyncClient to abort and close

_T = TypeVar("_T")
_Args = ParamSpec("_Args")


class _Closed(FsdError):
    """The `Client` was closed: its loop runs nothing any more."""


class _Inner(AsyncClient):
    """The `AsyncClient` of a sync `Client`: its errors name the `Client`."""

    _name = "Client"


class _Loop:
    """An event loop on a daemon thread of its own, running other threads' coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self.loop.run_forever, name="fsd-client")
        self._thread.daemon = True
        self._thread.start()

    def run(
        self,
        coro: Coroutine[Any, Any, _T],
        timeout: float | None,
        late: Callable[[], BaseException],
    ) -> _T:
        """`coro`'s result; after `timeout` seconds (None: none) it is cancelled and
        `late()` raised instead."""
        with self._lock:
            if self._closed:
                coro.close()
                raise _Closed("this fsd Client is closed")
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        if timeout is not None and timeout >= threading.TIMEOUT_MAX:  # timeout=inf
            timeout = None
        try:
            finished = concurrent.futures.wait([fut], timeout).done
        except BaseException:  # KeyboardInterrupt: the coroutine stops as well
            fut.cancel()
            raise
        if not finished and fut.cancel():
            raise late()
        try:
            return fut.result()
        except concurrent.futures.CancelledError:  # cut short by close()
            raise _Closed("the fsd Client was closed") from None

    def close(self, last: Coroutine[Any, Any, None]) -> None:
        """Run `last` (the client's own close) and what it ended, then stop the loop."""
        with self._lock:
            if self._closed:
                last.close()
                return
            self._closed = True
            fut = asyncio.run_coroutine_threadsafe(_finish(last), self.loop)
        try:
            fut.result(_CLOSE_WAIT)
        except Exception:  # a bug or a stuck loop: the thread stops all the same
            log.exception("closing the fsd Client failed")
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(_CLOSE_WAIT)
            if not self._thread.is_alive():
                self.loop.close()


async def _finish(last: Coroutine[Any, Any, None]) -> None:
    """Await `last`, then the callers' coroutines it failed; cancel any still left."""
    await last
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        _, left = await asyncio.wait(others, timeout=1.0)
        for task in left:  # their waiters get "closed" (`_Loop.run`)
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=1.0)


def _blocking(
    amethod: Callable[Concatenate[AsyncClient, _Args], Coroutine[Any, Any, _T]],
    extra: float | None = 0.0,
) -> Callable[Concatenate[Client, _Args], _T]:
    """The `Client` method of an `AsyncClient` one (same signature and doc): runs it on
    the client's loop and waits up to timeout + `extra` + a grace (None: no limit)."""

    @functools.wraps(amethod)
    def method(self: Client, *args: _Args.args, **kwargs: _Args.kwargs) -> _T:
        return self._run(amethod(self._async, *args, **kwargs), extra)

    method.__qualname__ = f"Client.{amethod.__name__}"
    return method


def _job(
    amethod: Callable[Concatenate[AsyncClient, _Args], Coroutine[Any, Any, AsyncJobHandle]],
    name: str,
) -> Callable[Concatenate[Client, _Args], JobHandle]:
    """A `Client` method that sends a job as `amethod` does and hands out its `JobHandle`."""
    run = _blocking(amethod)

    @functools.wraps(run)
    def method(self: Client, *args: _Args.args, **kwargs: _Args.kwargs) -> JobHandle:
        return JobHandle(self, run(self, *args, **kwargs))

    method.__name__, method.__qualname__ = name, f"Client.{name}"
    method.__signature__ = inspect.signature(amethod).replace(  # type: ignore[attr-defined]
        return_annotation="JobHandle"
    )
    return method


class JobHandle(JobView):
    """A submitted job: iterate it for `Chunk`s (text, token_ids, job_id) or wait for
    its `result()`. `job_id` blocks until the daemon accepts the job."""

    def __init__(self, client: Client, handle: AsyncJobHandle) -> None:
        self._client = client
        self._handle = handle
        self._state = handle._state  # fed on the loop while this thread waits

    @property
    def job_id(self) -> str:
        """The daemon's id for the job (waits for `Accepted`; raises its refusal)."""
        return self.accepted()

    def accepted(self, timeout: float | None = None) -> str:
        """Wait for the daemon to accept the job; its job id (or its refusal raised)."""
        self._until("answered", timeout)
        return self._state.accepted_id()

    def __iter__(self) -> Iterator[P.Chunk]:
        while True:
            self._until("ready", None)
            chunk = self._state.take()
            if chunk is None:
                return
            yield chunk

    def result(self, timeout: float | None = None) -> Completion:
        """The finished job (consumes the chunks not read yet)."""
        self._until("done", timeout)
        return self._state.outcome()

    def abort(self) -> dict[str, Any]:
        """Ask the daemon to stop this job; its result then ends with reason "abort"
        (a job that ended first: `AsyncJobHandle.abort`)."""
        self.accepted()
        return self._client._run(self._handle.abort(), self._client.timeout)

    def _until(self, what: str, timeout: float | None) -> None:
        """Wait until the job's `state.<what>` holds (TimeoutError after `timeout`)."""
        state = self._state
        if getattr(state, what):
            return

        def late() -> TimeoutError:
            return TimeoutError(f"job {self.req_id} gave no answer within {timeout:g} s")

        try:
            self._client._loop.run(self._handle._until(what), timeout, late)
        except _Closed as exc:  # nothing comes any more: its end is queued already
            sink = self._handle._sink
            while not getattr(state, what):
                state.feed(exc if sink.empty() else sink.get_nowait())


class Client(ClientBase[zmq.Context], Closes):
    """Synchronous client of one fsd daemon (thread-safe; see the module doc).

    Arguments: `ClientBase`'s. Each method is the `AsyncClient`'s of the same name,
    waited for.
    """

    def _setup(self, context: zmq.Context | None) -> None:
        # a shadow of the (sync) context: inproc endpoints need the one they are bound in
        ctx = zmq.asyncio.Context.shadow((context or zmq.Context.instance()).underlying)
        self._async = _Inner(
            self.endpoint, self.timeout, self._curve, self._heartbeat, self._token, ctx, self.affinity
        )
        self._injected: queue.Queue[Any] = queue.Queue()  # injected jobs' Finished
        self._finished_injected: dict[str, P.Finished] = {}
        self._core.injected = self._injected
        self._loop = _Loop()

    @property
    def _core(self) -> ClientCore:
        """The routing core of the AsyncClient (tests look at what travels)."""
        return self._async._core

    submit = _job(AsyncClient.submit, "submit")
    generate = _job(AsyncClient.submit, "generate")  # sent at once, as submit
    complete = _blocking(AsyncClient.complete, None)
    abort = _blocking(AsyncClient.abort)
    retune = _blocking(AsyncClient.retune)
    preview = _blocking(AsyncClient.preview, PREVIEW_TIME)
    inject = _blocking(AsyncClient.inject, INJECT_CHECK_TIME)
    jobs = _blocking(AsyncClient.jobs)
    job = _blocking(AsyncClient.job)
    status = _blocking(AsyncClient.status)
    undrain = _blocking(AsyncClient.undrain)

    def drain(self, timeout: float = 30.0, replica: int | None = None) -> dict[str, Any]:
        """Stop new jobs; returns once the daemon says in-flight jobs ended (or `timeout`)."""
        return self._run(self._async.drain(timeout, replica), timeout)

    def shutdown(self, drain: bool = True, timeout: float = 30.0) -> dict[str, Any]:
        return self._run(self._async.shutdown(drain, timeout), timeout)

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

    def _run(self, coro: Coroutine[Any, Any, _T], extra: float | None = 0.0) -> _T:
        """Run a coroutine of the AsyncClient; wait up to the call's own deadline
        (timeout + `extra`) and a grace, or as long as it takes (None)."""
        wait = None if extra is None else self.timeout + extra + _GRACE
        return self._loop.run(coro, wait, lambda: unavailable(self.endpoint, self.timeout))

    def close(self) -> None:
        """Abort this client's streaming jobs (and the injected ones it holds), fail
        what is pending and stop its loop."""
        self._loop.close(self._async.close())
