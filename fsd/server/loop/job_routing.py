"""Job routing: each iteration's tokens, and each ended job's result, to the client that owns it."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable

from fsd import protocol as P
from fsd.engine.face_protocol import Face
from fsd.engine.output import RequestOutput, StepDelta
from fsd.errors import UnknownJobError
from fsd.metrics import Finish, SLOWindow
from fsd.server.loop.clients import ClientBook, ClientState

log = logging.getLogger("fsd.server")

# jobs of reaped or dropped sessions aborted per call, the rest on the next loop turns:
# 10 silent sessions of 9,800 jobs each held the loop 0.7-2.5 s apiece (80 us an abort)
ABORTS_PER_TURN = 1000


class JobRouter:
    """Sends the engine's output to the owners `book` records."""

    def __init__(
        self,
        face: Face,
        book: ClientBook,
        send: Callable[[bytes | None, P.Reply], None],
        slo: SLOWindow,
    ) -> None:
        self.face = face
        self.book = book
        self.send = send
        self.slo = slo
        # in-process readers of every finished job (the HTTP /metrics histograms):
        # called on the loop's thread, so each must be quick (a queue put)
        self.taps: list[Callable[[RequestOutput], None]] = []
        self._doomed: deque[str] = deque()  # jobs of ended sessions still to abort

    def route(self, deltas: list[StepDelta]) -> None:
        """One iteration's new tokens (one `Tokens` per client), then the ended jobs."""
        book = self.book
        per_client: dict[bytes, list[P.Chunk]] = defaultdict(list)
        for d in deltas:
            owner = book.owners.get(d.job_id)
            if owner is not None and owner.stream:
                chunk = d.chunk  # the engine's, sent as it is once addressed
                chunk.req_id = owner.req_id
                chunk.start = book.streamed(chunk.job_id, len(chunk.token_ids))
                per_client[owner.caller.ident].append(chunk)
        for ident, chunks in per_client.items():
            self.send(ident, P.Tokens(chunks=chunks))
        for d in deltas:
            if d.output is not None:
                self.finished(d.output)

    def finished(self, out: RequestOutput) -> None:
        """Record a job's end and tell its client."""
        if out.per_token_latency is not None and out.ttft is not None:
            self.slo.add(
                Finish(
                    out.finish_time or time.time(),
                    out.per_token_latency,
                    out.ttft,
                    len(out.token_ids),
                    out.preemptions,
                    out.swaps_out + out.swaps_in,
                )
            )
        for tap in self.taps:
            tap(out)
        owner = self.book.release(out.request_id)
        if owner is not None:
            self.send(owner.caller.ident, finished_message(out, owner.req_id))

    def reap_silent_clients(self, timeout: float, heard_until: float | None = None) -> list[bytes]:
        """Abort the jobs of sessions silent for `timeout` seconds (no heartbeat);
        forget the silent ones no connection holds (an open connection keeps its empty
        session). The sessions reaped, whose other work the caller stops.

        `heard_until`: when the daemon last read every waiting frame (default now).
        Silence counts only up to then: a daemon that stalled (a flood of huge frames)
        must not take its own deafness for its clients' silence, and abort them all
        (the HTTP frontend's link among them, with every HTTP stream).
        """
        self.abort_due()
        now = time.time()
        until = now if heard_until is None else min(now, heard_until)
        reaped = []
        for ident, client in self.book.silent_since(until - timeout):
            if client.jobs:
                log.info(
                    "session %s went silent (nothing heard for %.1f s): aborting its %d jobs",
                    ident.decode(),
                    until - client.last_seen,
                    len(client.jobs),
                )
            self.abort_all(client)
            reaped.append(ident)
            if client.route is None:
                self.book.forget(ident)
            else:
                client.last_seen = now  # reaped: not looked at again for a timeout
        return reaped

    def abort_all(self, client: ClientState) -> None:
        """Abort every live job of a session (each answered if it can still be): up to
        `ABORTS_PER_TURN` now, the rest on later turns (`abort_due`)."""
        self._doomed.extend(client.jobs)
        self.abort_due()

    def abort_due(self) -> None:
        """Abort the next `ABORTS_PER_TURN` jobs of ended sessions (the loop calls this
        every turn, through `reap_silent_clients`)."""
        doomed = self._doomed
        for _ in range(min(len(doomed), ABORTS_PER_TURN)):
            job_id = doomed.popleft()
            with contextlib.suppress(UnknownJobError):  # ended meanwhile: nothing to do
                self.finished(self.face.abort(job_id))

    @property
    def aborting(self) -> int:
        """Jobs of ended sessions not aborted yet."""
        return len(self._doomed)


def finished_message(out: RequestOutput, req_id: str) -> P.Finished:
    return P.Finished(
        req_id=req_id,
        job_id=out.request_id,
        reason=out.finish_reason or "abort",
        text=out.text,
        token_ids=out.token_ids,
        timings=P.Timings(
            arrival=out.arrival_time,
            first_token=out.first_token_time,
            finish=out.finish_time,
            ttft=out.ttft,
            latency=out.latency,
            per_token_latency=out.per_token_latency,
            token_times=out.token_times,
        ),
        preemptions=out.preemptions,
        swaps_out=out.swaps_out,
        swaps_in=out.swaps_in,
        recomputes=out.recomputes,
        message=out.error,
        cached_tokens=out.cached_tokens,
    )
