"""The asyncio flavour of the client SDK: `AsyncClient`, same surface as `Client`.

    async with AsyncClient() as c:
        async for chunk in c.generate("Hello", max_tokens=32):
            print(chunk.text, end="")
        out = await c.complete("Hi", max_tokens=8)
        handles = [await c.submit(p) for p in prompts]
        results = await asyncio.gather(*(h.result() for h in handles))
        await c.retune(policy="fcfs"); reply = await c.preview(policy="fcfs")

Two tasks per client run on the event loop that first uses it: a reader that feeds
every frame to the shared `ClientCore` (routing), and a watcher that sleeps until
the core's next deadline or heartbeat and then expires, pings or probes. Everything
runs on that one loop, so an `AsyncClient` must not be shared across loops/threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from fsd import protocol as P
from fsd.client.base import (
    INJECT_CHECK_TIME,
    PREVIEW_TIME,
    ClientBase,
    Completion,
    build_inject,
    build_preview,
    build_submit,
    log,
)
from fsd.client.core import ClientCore, answered_by_id
from fsd.client.errors import RequestError
from fsd.client.job import JobState, JobView
from fsd.client.keys import connect
from fsd.errors import ConfigError, FsdError
from fsd.jobs import SamplingParams
from fsd.protocol_preview import DEFAULT_HORIZON, DEFAULT_SEEDS

ABORT_LINGER_MS = 2000  # how long a closed client's abort frames may take to leave


class AsyncJobHandle(JobView):
    """One job of an `AsyncClient`: `async for` its chunks or `await result()`.

    A handle from `generate()` submits on first use; one from `submit()` already has.
    `job_id` is None until the daemon accepts the job (`await accepted()`).
    """

    def __init__(self, client: AsyncClient, req_id: str, frame: bytes) -> None:
        self._client = client
        self._frame: bytes | None = frame
        self._sink: asyncio.Queue[Any] = asyncio.Queue()
        self._state = JobState(req_id)

    @property
    def job_id(self) -> str | None:
        return self._state.job_id

    async def accepted(self) -> str:
        """Wait for the daemon to accept the job; its job id (or its refusal raised)."""
        await self._until("answered")
        return self._state.accepted_id()

    def __aiter__(self) -> AsyncIterator[P.Chunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[P.Chunk]:
        while True:
            await self._until("ready")
            chunk = self._state.take()
            if chunk is None:
                return
            yield chunk

    async def result(self) -> Completion:
        """The finished job (consumes the chunks not read yet)."""
        await self._until("done")
        return self._state.outcome()

    async def abort(self) -> dict[str, Any]:
        """Ask the daemon to stop this job; its result then ends with reason "abort".

        A job that ended first is no error: the daemon answers "unknown-job" and the
        end is on its way, so this waits for it (up to the client's timeout) and answers
        {"job_id", "tokens", "ended": its finish reason}; the result keeps that reason.
        """
        job_id = await self.accepted()
        try:
            return await self._client.abort(job_id)
        except RequestError as exc:
            if exc.code != "unknown-job":
                raise
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._client.timeout):
                    await self._until("done")
            out = self._state.result
            if out is None:  # it never came, or the stream failed: the refusal stands
                raise
            return {"job_id": job_id, "tokens": len(out.token_ids), "ended": out.finish_reason}

    async def _until(self, what: str) -> None:
        """Feed the job's state from its stream until `state.<what>` holds, then all
        that has arrived meanwhile (cancelling it loses nothing)."""
        await self._ensure_sent()
        state, sink = self._state, self._sink
        while not getattr(state, what):
            state.feed(await sink.get())
        while not sink.empty():
            state.feed(sink.get_nowait())

    async def _ensure_sent(self) -> None:
        if self._frame is not None:
            frame, self._frame = self._frame, None
            await self._client._send_submit(self.req_id, frame, self._sink)


class AsyncClient(ClientBase[zmq.asyncio.Context]):
    """Asyncio client of one fsd daemon (arguments: `ClientBase`)."""

    _name = "AsyncClient"  # as its errors call it (the sync Client runs one of its own)

    def _setup(self, context: zmq.asyncio.Context | None) -> None:
        curve = self._curve
        self._keys = curve.resolve() if curve is not None else None
        self._core = ClientCore(
            self.endpoint, self.timeout, self._heartbeat, curve=curve is not None, token=self._token
        )
        self._ctx = context or zmq.asyncio.Context.instance()
        self._sock: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._closed = False

    # ---- generation --------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        tags: Sequence[str] = (),
        affinity: str | None = None,
        params: SamplingParams | None = None,
        owner: str | None = None,
        **sampling: Any,
    ) -> AsyncJobHandle:
        """A job to stream with `async for`; sent on first use (validated now).
        `affinity`: this request's key (default: the client's); `owner`: whose job it
        is, for caps and turns (an operator relaying others' requests)."""
        req_id = self._core.next_req_id()
        key = affinity or self.affinity
        msg = build_submit(req_id, prompt, params, sampling, tags, key, owner)
        return AsyncJobHandle(self, req_id, self._core.encode(msg))

    async def submit(
        self,
        prompt: str | Sequence[int],
        *,
        tags: Sequence[str] = (),
        affinity: str | None = None,
        params: SamplingParams | None = None,
        **sampling: Any,
    ) -> AsyncJobHandle:
        """Send one job now, without waiting for it to be accepted; sampling keywords as
        `fsd.SamplingParams`. Iterate its handle for chunks, or wait for its `result()`."""
        handle = self.generate(prompt, tags=tags, affinity=affinity, params=params, **sampling)
        await handle._ensure_sent()
        return handle

    async def complete(
        self,
        prompt: str | Sequence[int],
        *,
        tags: Sequence[str] = (),
        affinity: str | None = None,
        params: SamplingParams | None = None,
        **sampling: Any,
    ) -> Completion:
        """Run one job to its end and return the whole result."""
        handle = self.generate(prompt, tags=tags, affinity=affinity, params=params, **sampling)
        return await handle.result()

    # ---- control -----------------------------------------------------------------

    async def abort(self, job_id: str) -> dict[str, Any]:
        """Ask the daemon to stop a job; its result then ends with reason "abort"."""
        return (await self._call(P.Abort(job_id=job_id), "ack:abort")).detail

    async def retune(self, *, replica: int | None = None, **changes: Any) -> dict[str, Any]:
        """Change scheduling settings live (`replica`: on that one of a daemon's several
        replicas only); returns the resulting config."""
        if not changes:
            raise ConfigError("retune needs at least one setting, e.g. policy='fcfs'")
        msg = P.Retune(changes=changes, replica=replica)
        detail = (await self._call(msg, "ack:retune")).detail
        return detail.get("config", detail)

    async def preview(
        self, horizon: float = DEFAULT_HORIZON, seeds: int = DEFAULT_SEEDS, **changes: Any
    ) -> P.PreviewReply:
        """What would `changes` (retune's keys) do over the next `horizon` seconds?

        The daemon runs its twin from a snapshot of the live state, `seeds` times under
        the current settings and under `changes`; nothing is applied. Takes seconds to a
        minute; RequestError "overloaded" while another preview runs.
        """
        msg = build_preview(changes, horizon, seeds, self._core.next_req_id())
        return await self._call(msg, "preview", PREVIEW_TIME)

    async def inject(
        self,
        burst: P.Burst | Sequence[int] | dict[str, int] | None = None,
        scenario: str | Path | None = None,
        tag: str = "injected",
    ) -> list[str]:
        """Inject tagged jobs: `burst=(count, input_len, output_len)` or a scenario
        (a file path or TOML text, read by the daemon). Returns their job ids; the jobs
        are this client's until it closes (heartbeats keep them alive; closing aborts
        those still running)."""
        msg = build_inject(burst, scenario, tag, self._core.next_req_id())
        reply = await self._call(msg, "ack:inject", INJECT_CHECK_TIME)
        self._kick.set()  # heartbeats from now on: the jobs are held
        return list(reply.detail.get("job_ids", []))

    async def jobs(self) -> list[P.JobInfo]:
        return (await self._call(P.ListJobs(), "jobs")).jobs

    async def job(self, job_id: str) -> P.JobInfo:
        return (await self._call(P.GetJob(job_id=job_id), "job")).job

    async def status(self) -> P.StatusReply:
        return await self._call(P.Status(), "status")

    async def drain(self, timeout: float = 30.0, replica: int | None = None) -> dict[str, Any]:
        """Stop new jobs; returns once the daemon says in-flight jobs ended (or `timeout`).
        `replica`: one of a daemon's several, whose jobs move to the others (at once)."""
        msg = P.Drain(timeout=timeout, replica=replica)
        return (await self._call(msg, "ack:drain", timeout, deferred=replica is None)).detail

    async def undrain(self, replica: int | None = None) -> dict[str, Any]:
        """Accept new jobs again after a drain (operator); `replica`: that one only."""
        return (await self._call(P.Undrain(replica=replica), "ack:undrain")).detail

    async def shutdown(self, drain: bool = True, timeout: float = 30.0) -> dict[str, Any]:
        msg = P.Shutdown(drain=drain, timeout=timeout)
        return (await self._call(msg, "ack:shutdown", timeout, deferred=True)).detail

    async def _call(
        self, msg: P.Request, key: str, extra: float = 0.0, deferred: bool = False
    ) -> Any:
        frame = self._core.encode(msg)
        self._start()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._core.add_call(key, fut, time.monotonic(), extra, deferred, answered_by_id(msg))
        await self._send(frame)  # if it cannot go, its deadline expires
        self._kick.set()
        reply = await fut
        if isinstance(reply, P.Error):
            raise RequestError.of(reply)
        return reply

    async def _send_submit(self, req_id: str, frame: bytes, sink: asyncio.Queue[Any]) -> None:
        self._start()
        self._core.add_stream(req_id, sink, time.monotonic())
        await self._send(frame)
        self._kick.set()

    # ---- life --------------------------------------------------------------------

    async def close(self) -> None:
        """Abort this client's streaming jobs and close the socket."""
        if self._closed:
            return
        self._closed = True
        aborts = self._core.abort_frames()
        if self._sock is not None:
            for frame in aborts:
                await self._send(frame)
        self._core.fail_all(FsdError(f"the fsd {self._name} was closed"))
        for task in (self._reader, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._sock is not None:
            # the aborts must leave even on a loaded machine (the daemon would reap the
            # jobs only after its client_timeout)
            self._sock.close(linger=ABORT_LINGER_MS if aborts else 0)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _start(self) -> None:
        if self._closed:
            raise FsdError(f"this fsd {self._name} is closed")
        if self._sock is None:
            self._sock = connect(self._ctx, zmq.DEALER, self.endpoint, self._keys)
            self._reader = asyncio.create_task(self._read(self._sock))
            self._watcher = asyncio.create_task(self._watch())

    async def _send(self, frame: bytes) -> None:
        assert self._sock is not None
        try:
            for hello in self._core.before_send():  # a new socket's first frame
                await self._sock.send(hello, zmq.NOBLOCK)
            await self._sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # the send queue is full: the daemon has not read for a long time
            return
        self._core.sent(time.monotonic())

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        try:
            while True:
                frame = await sock.recv()
                self._core.on_frame(frame, time.monotonic())
        except (asyncio.CancelledError, zmq.ZMQError) as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                return  # closing or reconnecting: not a failure
            # the socket was closed under this reader (its recv cancelled) or failed:
            # nothing more can arrive, so its requests fail now instead of hanging
            if sock is self._sock and not self._closed:
                why = "was closed" if isinstance(exc, asyncio.CancelledError) else f"failed: {exc}"
                self._core.fail_all(FsdError(f"the fsd {self._name}'s socket {why}"))
            return
        except Exception as exc:  # a bug must not leave callers waiting forever
            log.exception("the fsd AsyncClient reader failed")
            self._core.fail_all(FsdError(f"the fsd client reader failed: {exc}"))

    async def _watch(self) -> None:
        core = self._core
        while True:
            wait = core.next_wakeup(time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), wait)
            self._kick.clear()
            now = time.monotonic()
            if core.expired(now):
                core.reset(now)
                self._reconnect()
            for frame in core.tick(now):
                await self._send(frame)

    def _reconnect(self) -> None:
        """A fresh DEALER: late answers to the old one can never be mistaken for new."""
        assert self._sock is not None and self._reader is not None
        self._reader.cancel()
        self._sock.close(linger=0)
        self._sock = connect(self._ctx, zmq.DEALER, self.endpoint, self._keys)
        self._reader = asyncio.create_task(self._read(self._sock))
