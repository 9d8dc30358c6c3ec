"""A gate's connection table: who may take a slot, and whose slot goes to make room.

Design: a table of `cap` connections that anyone may fill is a lock-out anyone can
cause (4,096 connections that finish their handshake and say nothing kept every
client out, the operator too). So:

* each peer (`fsd.server.transport.peers`: a remote address, a local user) holds at most
  `per_peer` connections;
* when the table (or a peer's share) is full, a connection that makes no use of its
  slot is closed for the newcomer: first one still in its handshake after
  `HANDSHAKE_GRACE` (an honest one takes milliseconds), then one idle (no message
  in, nothing out) for `IDLE_AFTER`, the longest idle first, from the peer holding
  the most connections. Its client loses nothing: it reconnects, and its session
  resumes;
* the last `reserve` slots are the operator's: a newcomer that finds no room goes on
  probation (`Verdict.PROBATION`), and only the operator (the daemon's own user on
  this machine, or a request carrying the operator token, which the gate reads from
  the connection's first frame) takes a reserved slot; anyone else is refused.

The table lives on the gate's thread; `Slot.close` ends a connection's relay there.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

HANDSHAKE_GRACE = 1.0  # seconds in a handshake after which a slot may go for room
IDLE_AFTER = 2.0  # seconds without a message in or bytes out after which it may go


class Verdict(enum.Enum):
    """What a newcomer gets: a slot, probation (the reserve, if it is the operator's),
    or refusal."""

    OPEN = "open"
    PROBATION = "probation"
    REFUSE = "refuse"


class Connection(Protocol):
    """What the table sees of a connection (`fsd.server.transport.relay.Relay`)."""

    ready: bool  # its handshake ended
    active: float  # when it last did something (monotonic)

    def close(self, why: str) -> None: ...


@dataclass(eq=False)
class Slot:
    """One connection in the table: its peer, and the connection itself."""

    rid: bytes
    peer: str
    conn: Connection
    opened: float = 0.0
    operator: bool = False


class ConnectionTable:
    """The slots of one gate (module doc)."""

    def __init__(
        self, cap: int, per_peer: int, reserve: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cap = cap
        self.per_peer = max(1, per_peer)
        self.reserve = min(reserve, cap - 1) if cap > 1 else 0
        self.clock = clock
        self.slots: dict[bytes, Slot] = {}  # in the order they were taken
        self.peers: Counter[str] = Counter()
        self.reclaimed = 0  # connections closed to make room

    def __len__(self) -> int:
        return len(self.slots)

    def admit(self, peer: str) -> tuple[Verdict, str]:
        """Whether a newcomer from `peer` may take a slot now (closing a slot that makes
        no use of it if needed), and why not."""
        if self.peers[peer] >= self.per_peer and not self._reclaim(peer):
            return Verdict.PROBATION, (
                f"this peer ({peer}) holds {self.peers[peer]} connections; the daemon takes "
                f"{self.per_peer} from one peer"
            )
        if len(self.slots) >= self.cap - self.reserve and not self._reclaim(None):
            why = (
                f"the daemon holds {len(self.slots)} connections, none idle; max_connections "
                f"is {self.cap}"
            )
            return (Verdict.PROBATION if len(self.slots) < self.cap else Verdict.REFUSE), why
        return Verdict.OPEN, ""

    def may_reserve(self) -> bool:
        """Whether the operator on probation finds a reserved slot free."""
        return len(self.slots) < self.cap or self._reclaim(None)

    def add(self, slot: Slot) -> None:
        slot.opened = self.clock()
        self.slots[slot.rid] = slot
        self.peers[slot.peer] += 1

    def remove(self, rid: bytes) -> None:
        slot = self.slots.pop(rid, None)
        if slot is not None:
            self.peers[slot.peer] -= 1
            if not self.peers[slot.peer]:
                del self.peers[slot.peer]

    def _reclaim(self, peer: str | None) -> bool:
        """Close one slot for room (of `peer`'s, or anyone's): True if one was."""
        victim = self.victim(peer)
        if victim is None:
            return False
        self.remove(victim.rid)  # its relay ends on a later pass: the room is taken now
        self.reclaimed += 1
        conn = victim.conn
        state = f"idle for {self.clock() - conn.active:.0f} s" if conn.ready else "in its handshake"
        conn.close(f"{state}: its slot went to a newcomer")
        return True

    def victim(self, peer: str | None) -> Slot | None:
        """The slot to close for room: one stuck in its handshake, else the longest
        idle of the peer holding the most (module doc); never the operator's."""
        now = self.clock()
        idle: dict[str, Slot] = {}  # per peer, its longest idle slot
        for slot in self.slots.values():
            if slot.operator or (peer is not None and slot.peer != peer):
                continue
            conn = slot.conn
            if not conn.ready:
                if now - slot.opened >= HANDSHAKE_GRACE:
                    return slot  # the oldest stuck one
                continue
            since = conn.active
            if now - since >= IDLE_AFTER:
                best = idle.get(slot.peer)
                if best is None or since < best.conn.active:
                    idle[slot.peer] = slot
        if not idle:
            return None
        return idle[max(idle, key=lambda p: (self.peers[p], -idle[p].conn.active))]
