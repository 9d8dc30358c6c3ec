"""A frame a client sent just before closing its connection may be read after the
gate reported the close: it still speaks for that connection's session (its jobs'
aborts reach them), and only for it."""

from __future__ import annotations

from fsd.config import ServerConfig
from fsd.server.clients import _GONE_KEPT, ClientBook


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
