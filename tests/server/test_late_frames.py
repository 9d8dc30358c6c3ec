"""A frame a client sent just before closing its connection may be read after the
gate reported the close: it still speaks for that connection's session (its jobs'
aborts reach them), and only for it."""

from __future__ import annotations

from fsd import protocol as P
from fsd.config import ServerConfig
from fsd.server.loop.clients import _GONE_KEPT, ClientBook
from fsd.server.loop.frontend import Frontend


def test_a_frame_read_after_its_connection_closed_speaks_for_its_session():
    book = ClientBook(ServerConfig())
    first = book.heard(b"route-1", 1.0, None)
    book.detach(b"route-1")  # the gate saw it close
    late = book.heard(b"route-1", 2.0, None)  # its abort, read just after
    assert late is first and late.route is None and late.last_seen == 2.0
    other = book.heard(b"route-2", 3.0, None)  # another connection: another session
    assert other is not first
    book.forget(first.key)  # a forgotten session: a late frame gets a fresh one
    assert book.heard(b"route-1", 4.0, None) is not first


def test_under_curve_a_late_frame_of_another_key_gets_a_fresh_session():
    book = ClientBook(ServerConfig())
    first = book.heard(b"route-1", 1.0, "key-a")
    book.detach(b"route-1")
    assert book.heard(b"route-1", 2.0, "key-b") is not first


def test_closed_connections_are_remembered_within_a_bound():
    book = ClientBook(ServerConfig())
    for i in range(_GONE_KEPT + 500):
        route = b"r%d" % i
        book.heard(route, float(i), None)
        book.detach(route)
    assert len(book._gone) == _GONE_KEPT


def test_a_closed_connections_questions_are_not_answered():
    """Its ListJobs left in the socket cost the engine a row per job each and nobody
    reads the answers (issue P21: a dropped non-reader's 1,000 of them, 30 s)."""
    class Router:
        sent: list[list[bytes]] = []

        def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
            self.sent.append(frames)

    book = ClientBook(ServerConfig())
    asked: list[P.Request] = []
    front = Frontend(
        Router(), ServerConfig(), book, _Auth(), lambda c, m: asked.append(m), None, False
    )
    front.handle([b"route-1", P.encode(P.ListJobs())])
    book.detach(b"route-1")
    front.handle([b"route-1", P.encode(P.ListJobs())])
    front.handle([b"route-1", P.encode(P.Abort(job_id="job-1"))])  # an abort still counts
    assert [type(m) for m in asked] == [P.ListJobs, P.Abort]
    assert not book.closed(b"route-2") and book.closed(b"route-1")


class _Auth:
    def role(self, msg: object, user_id: str | None) -> str:
        return "client"

    def check(self, msg: object, role: str) -> None:
        return None


def test_a_turn_reads_until_its_time_is_up_while_the_engine_waits(monkeypatch):
    """With the engine busy (receive(0)) a turn ends once _TURN_SECONDS have passed,
    after at least one message; idle (a wait), it reads up to the count bound."""
    import zmq

    import fsd.server.loop.frontend as frontend

    class Router:
        def __init__(self, waiting: int) -> None:
            self.waiting = waiting

        def poll(self, timeout: int) -> bool:
            return self.waiting > 0

        def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[bytes]:
            if not self.waiting:
                raise zmq.Again()
            self.waiting -= 1
            return [b"route-1", P.encode(P.Ping())]

        def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
            pass

    def turn(timeout: int) -> int:
        router = Router(50)
        front = Frontend(router, ServerConfig(), ClientBook(ServerConfig()), _Auth(),
                         lambda c, m: None, None, False)  # fmt: skip
        front.receive(timeout)
        return 50 - router.waiting

    monkeypatch.setattr(frontend, "_TURN_SECONDS", 0.0)
    assert turn(0) == 1  # busy: one message, then the engine's iteration
    assert turn(200) == 50  # idle: everything waiting
    monkeypatch.setattr(frontend, "_TURN_SECONDS", 60.0)
    assert turn(0) == 50
