"""The daemon's per-job and per-client state is released or bounded (issue P20).

Each structure keyed by a job or a session empties when the job ends and its owner
was answered, or when the session is forgotten; each window of recent things (the
SLO window, the failure log, /metrics' pairing tables) holds a fixed number at most.
"""

from __future__ import annotations

from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.engine.output import RequestOutput, StepDelta
from fsd.metrics import Finish, SLOWindow
from fsd.server.loop.clients import _OUTBOX_EXTRA, ClientBook
from fsd.server.loop.job_routing import JobRouter
from fsd.server.loop.service import OnceLog
from fsd.server.publish import prom
from fsd.server.publish.prom import MetricsCollector
from fsd.server.roles import Caller


def _output(job_id: str, t: float = 1.0) -> RequestOutput:
    return RequestOutput(
        request_id=job_id, prompt=None, prompt_token_ids=[1, 2, 3], text="xy",
        token_ids=[7, 8], finish_reason="length", arrival_time=t - 0.5,
        first_token_time=t - 0.25, finish_time=t, token_times=[t - 0.25, t],
    )  # fmt: skip


class _NoJobs:
    """A face with no live job (the reaper aborts none here)."""

    def abort(self, job_id: str) -> RequestOutput:
        raise AssertionError(f"nothing should be aborted, got {job_id}")


def _router(book: ClientBook, slo: SLOWindow) -> tuple[JobRouter, list[bytes]]:
    sent: list[bytes] = []
    return JobRouter(_NoJobs(), book, lambda ident, msg: sent.append(ident), slo), sent  # type: ignore[arg-type]


def test_the_client_book_forgets_each_job_once_its_owner_heard_its_end() -> None:
    book = ClientBook(ServerConfig())
    router, sent = _router(book, SLOWindow(60.0, 0.1))
    clients = [book.heard(b"route-%d" % k, 0.0, None) for k in range(2)]
    for i in range(3000):
        job_id, client = f"job-{i}", clients[i % 2]
        book.own(job_id, Caller(client.key), f"req-{i}")
        router.route([StepDelta(job_id, (7,), "x")])
        router.route([StepDelta(job_id, (8,), "y", _output(job_id))])
    assert len(sent) == 3 * 3000  # its two tokens and its end reached its owner
    assert not book.owners and not book._streamed
    assert all(not c.jobs and not c.req_ids and not c.outbox and not c.chunks for c in clients)


def test_a_closed_sessions_held_answers_are_bounded_and_go_when_it_is_forgotten() -> None:
    book = ClientBook(ServerConfig())
    router, _ = _router(book, SLOWindow(60.0, 0.1))
    client = book.heard(b"route", 0.0, None)
    book.hello(client, None, 0.0)  # it has a secret: the session may be resumed
    jobs = [f"job-{i}" for i in range(200)]
    for i, job_id in enumerate(jobs):
        book.own(job_id, Caller(client.key), f"req-{i}")
    book.detach(b"route")  # its connection closed
    router.send = lambda ident, msg: client.keep(msg)  # the frontend, for a detached one
    for _ in range(50):  # tokens while detached: one merged chunk per live job
        router.route([StepDelta(j, (7,), "x") for j in jobs])
    for job_id in jobs:
        router.route([StepDelta(job_id, (8,), "y", _output(job_id))])
    for i in range(1000):  # more answers than jobs: the rest are dropped
        client.keep(P.Ack(what="ping", detail={"n": i}))
    assert len(client.chunks) == len(jobs) and not client.jobs
    assert len(client.outbox) <= len(jobs) + _OUTBOX_EXTRA
    assert router.reap_silent_clients(timeout=1.0) == [client.key]
    assert not book.clients and not book.routes and not book._by_secret and not book.owners


def test_the_slo_window_is_bounded_in_time_and_in_count_without_being_read() -> None:
    window = SLOWindow(60.0, 0.1, cap=1000)
    for t in range(5000):  # one a second: only the last minute stays
        window.add(Finish(float(t), 0.01, 0.1, 4))
    assert len(window) == 61
    for _ in range(5000):  # a burst in one instant: the latest `cap`
        window.add(Finish(5000.0, 0.01, 0.1, 4))
    assert len(window) == 1000
    stats = window.stats(5000.0)
    assert stats["finished"] == 1000 and stats["requests_per_s"] > 1000 / 60.0


def test_the_failure_log_counts_a_bounded_number_of_distinct_failures() -> None:
    failures = OnceLog(limit=50)
    for i in range(2000):  # each message names its job: all distinct
        failures.exception("the loop's routing failed", RuntimeError(f"job-{i} broke"))
    assert len(failures.seen) == 50 and failures.others == 1950


def test_metrics_keep_no_label_or_pairing_entry_per_job(monkeypatch) -> None:
    monkeypatch.setattr(prom, "_PENDING_CAP", 100)
    m = MetricsCollector("tiny")
    for i in range(1000):  # started, never finished (their results lost): capped
        m.telemetry(P.TOPIC_EVENT, P.Event(time=1.0, kind="start", job_id=f"lost-{i}"))
    for i in range(1000):  # finished normally: paired, then forgotten
        job_id = f"job-{i}"
        m.telemetry(P.TOPIC_EVENT, P.Event(time=0.6, kind="start", job_id=job_id))
        m.job_finished(_output(job_id))
        m.telemetry(P.TOPIC_EVENT, P.Event(time=1.0, kind="finish", job_id=job_id))
    text = m.render().decode()
    assert m.unpaired <= 100
    assert "job-" not in text and "lost-" not in text  # no label names a job
