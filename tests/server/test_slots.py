"""The connection table's decisions (`fsd.server.transport.slots`): a share per peer, the
stuck and the longest idle closed for newcomers, the operator's reserve."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsd.server.transport.slots import HANDSHAKE_GRACE, IDLE_AFTER, ConnectionTable, Slot, Verdict


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class Conn:
    ready: bool = True
    active: float = 0.0
    closed: list[str] = field(default_factory=list)

    def close(self, why: str) -> None:
        self.closed.append(why)


def _fill(table: ConnectionTable, peer: str, n: int, clock: Clock, **kw) -> list[Conn]:
    conns = []
    for _ in range(n):
        conn = Conn(active=clock.now, **kw)
        table.add(Slot(f"{peer}-{len(table)}".encode(), peer, conn))
        conns.append(conn)
    return conns


def test_a_peer_past_its_share_makes_room_from_its_own_idle_connections_only():
    clock = Clock()
    table = ConnectionTable(cap=100, per_peer=3, reserve=4, clock=clock)
    other = _fill(table, "uid:1", 3, clock)
    mine = _fill(table, "uid:2", 3, clock)
    assert table.admit("uid:2")[0] is Verdict.PROBATION  # all busy: its share is full
    clock.now += IDLE_AFTER + 1
    verdict, _ = table.admit("uid:2")
    assert verdict is Verdict.OPEN
    assert sum(bool(c.closed) for c in mine) == 1 and not any(c.closed for c in other)
    assert table.peers["uid:2"] == 2 and table.reclaimed == 1
    assert table.admit("uid:3")[0] is Verdict.OPEN  # another peer: room in the table


def test_a_full_table_closes_a_stuck_handshake_first_then_the_hoarders_longest_idle():
    clock = Clock()
    table = ConnectionTable(cap=10, per_peer=100, reserve=2, clock=clock)
    honest = _fill(table, "uid:1", 2, clock)
    clock.now += 1
    hoard = _fill(table, "uid:6", 5, clock)
    stuck = _fill(table, "uid:9", 1, clock, ready=False)
    assert len(table) == 8  # the reserve's 2 are left
    clock.now += HANDSHAKE_GRACE + 0.1  # nobody idle long enough yet: the stuck one goes
    assert table.admit("uid:3")[0] is Verdict.OPEN and stuck[0].closed
    _fill(table, "uid:3", 1, clock)  # the newcomer takes its slot
    clock.now += IDLE_AFTER
    hoard[2].active = clock.now - IDLE_AFTER - 5  # the hoarder's longest idle
    assert table.admit("uid:3")[0] is Verdict.OPEN
    assert hoard[2].closed and "idle for" in hoard[2].closed[0]
    assert not any(c.closed for c in honest)  # the peer holding the most gives first


def test_past_the_clients_room_newcomers_are_on_probation_and_only_the_reserve_is_left():
    clock = Clock()
    table = ConnectionTable(cap=10, per_peer=100, reserve=2, clock=clock)
    _fill(table, "uid:1", 8, clock)  # busy: nothing to close
    verdict, why = table.admit("uid:2")
    assert verdict is Verdict.PROBATION and "max_connections is 10" in why
    assert table.may_reserve()
    table.add(Slot(b"op-1", "uid:0", Conn(active=clock.now), operator=True))
    table.add(Slot(b"op-2", "uid:0", Conn(active=clock.now), operator=True))
    assert table.admit("uid:2")[0] is Verdict.REFUSE and not table.may_reserve()
    clock.now += 3600  # everyone idle: the operator's slots are never taken for room
    assert table.admit("uid:2")[0] is Verdict.OPEN
    assert {s.rid for s in table.slots.values() if s.operator} == {b"op-1", b"op-2"}
    table.remove(b"op-1")
    assert "uid:0" in table.peers and table.peers["uid:0"] == 1
