"""A reaped session's jobs are aborted a turn's worth at a time (`ABORTS_PER_TURN`),
so reaping 10 sessions of 9,800 jobs does not hold the loop for seconds; each job is
aborted once, its owner's counts released, and a job that ended meanwhile is skipped."""

from __future__ import annotations

from fsd.config import ServerConfig
from fsd.engine.output import RequestOutput
from fsd.errors import UnknownJobError
from fsd.metrics import SLOWindow
from fsd.server.loop.clients import Caller, ClientBook
from fsd.server.loop.job_routing import ABORTS_PER_TURN, JobRouter


class _Face:
    """Live job ids; `abort` ends one (UnknownJobError for an ended one)."""

    def __init__(self, ids: list[str]) -> None:
        self.live = set(ids)
        self.aborted: list[str] = []

    def abort(self, job_id: str) -> RequestOutput:
        if job_id not in self.live:
            raise UnknownJobError(job_id)
        self.live.remove(job_id)
        self.aborted.append(job_id)
        return RequestOutput(
            request_id=job_id, prompt=None, prompt_token_ids=[1], text="", token_ids=[],
            finish_reason="abort", arrival_time=0.0, first_token_time=None, finish_time=1.0,
        )  # fmt: skip


def test_a_reaped_sessions_jobs_end_a_turns_worth_at_a_time():
    book = ClientBook(ServerConfig())
    n = 2 * ABORTS_PER_TURN + 500
    ids = [f"job-{i}" for i in range(n)]
    face = _Face(ids)
    router = JobRouter(face, book, lambda ident, msg: None, SLOWindow(60.0, 0.1))  # type: ignore[arg-type]
    client = book.heard(b"route", 0.0, None)
    for i, job_id in enumerate(ids):
        book.own(job_id, Caller(client.key), f"req-{i}")
    assert router.reap_silent_clients(timeout=1.0) == [client.key]
    router.finished(face.abort("job-1500"))  # it ends otherwise before its turn comes
    face.aborted.remove("job-1500")
    assert len(face.aborted) == ABORTS_PER_TURN and router.aborting == n - ABORTS_PER_TURN
    router.reap_silent_clients(timeout=1.0)  # the next turns go on with the rest
    router.reap_silent_clients(timeout=1.0)
    assert router.aborting == 0 and len(face.aborted) == n - 1
    assert face.aborted == [j for j in ids if j != "job-1500"]  # in order, each once
    assert not book.owners and not book._live_by and not client.jobs
