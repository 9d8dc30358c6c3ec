"""The inbound budget: bytes of client frames the gate passed on and the daemon has not read.

The gate (`fsd.server.transport.gate`, its own thread) asks `take` before it passes a frame to
the ROUTER; the Frontend (the engine thread) gives each message's bytes back as it
reads it (`give_back`). What is held is bounded by `limit`, all connections together:

* a frame that does not fit is refused (NULL) or waits (CURVE), decided by the gate;
* the last `reserve` bytes are for small frames (at most `small` bytes) of a
  connection with nothing of its own in flight, so a flood of big frames cannot keep
  an honest client's request out; under CURVE the gate cannot tell whose a frame the
  Frontend read (libzmq names the connection), so there any small frame may use it;
* one connection (NULL: the gate names it) may hold at most `per_connection` bytes,
  so one client cannot take the whole budget from the others;
* when nothing is held the next frame passes whatever its size, so a frame that fits
  the configuration always gets through eventually;
* a message in progress (taken, its last part not yet passed whole) is what libzmq
  discards when its connection ends: the relay reports each message's end
  (`completed`) and gives an unfinished one back when it closes (`abandon`), so a
  connection that sends a header and leaves holds nothing;
* drift (what libzmq discards that the gate cannot see end: a CURVE peer's own
  heartbeats, a CURVE multipart message cut short) is settled when the Frontend finds
  its socket empty, no message is in progress and the gate passed nothing on for
  `idle` seconds: the total is then 0 (`settle_if_idle`).

Each frame costs its bytes plus `FRAME_COST` (libzmq's message and pipe overhead), so
empty frames are not free.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

FRAME_COST = 64  # bytes a queued message costs libzmq beside its body (msg_t)
SMALL_FRAME = 64 * 1024
SETTLE_IDLE = 1.0  # seconds without a frame passed on before an empty socket settles


def cost(size: int) -> int:
    """What a frame of `size` body bytes costs the budget."""
    return size + FRAME_COST


class InboundLedger:
    """Thread-safe count of the bytes held for clients on the way in (module doc)."""

    def __init__(
        self,
        limit: int,
        *,
        small: int = SMALL_FRAME,
        reserve: int | None = None,
        idle: float = SETTLE_IDLE,
        per_connection: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.per_connection = per_connection if per_connection is not None else limit
        self.small = small
        self.reserve = reserve if reserve is not None else max(4 * cost(small), limit // 16)
        self.idle = idle
        self.clock = clock
        self.held = 0
        self.open = 0  # of `held`: bytes of messages still in progress at the gate
        self.refused = 0  # frames refused (answered "overloaded" or "too-large")
        self.refused_bytes = 0
        self.settled = 0  # bytes written off by settle_if_idle
        self._own: dict[bytes, int] = {}  # connection (NULL routing id) -> bytes held
        self._lock = threading.Lock()
        self._last_pass = -float("inf")
        self.last_refusal = ""  # why the last `take` found no room (the gate's thread)

    def take(self, key: bytes | None, size: int, *, reserve_ok: bool = False) -> bool:
        """Count a frame of `size` bytes from connection `key` (None: unknown, CURVE)
        if it fits; False if it does not (nothing counted). `reserve_ok`: it may use
        the reserve whatever its size (a stand-in: small, and bounded by the frame)."""
        need = cost(size)
        with self._lock:
            if self.held:
                own = self._own.get(key, 0) if key is not None else 0
                may_reserve = reserve_ok or (size <= self.small and own == 0)
                room = self.limit - self.held - (0 if may_reserve else self.reserve)
                if need > room:
                    self.last_refusal = "inbound budget full"
                    return False
                if own and own + need > self.per_connection and not reserve_ok:
                    self.last_refusal = (
                        f"the connection holds {own} bytes of its {self.per_connection}"
                    )
                    return False
            self.held += need
            self.open += need
            if key is not None:
                self._own[key] = self._own.get(key, 0) + need
            self._last_pass = self.clock()
        return True

    def passing(self) -> None:
        """A counted frame's body is still on its way: not idle (no settling yet)."""
        self._last_pass = self.clock()

    def completed(self, taken: int) -> None:
        """A message whose frames cost `taken` passed whole: libzmq delivers it."""
        with self._lock:
            self.open = max(0, self.open - taken)

    def abandon(self, key: bytes | None, taken: int) -> None:
        """A connection ended inside a message whose frames cost `taken`: libzmq
        discards it, so the Frontend never gives it back."""
        with self._lock:
            self.open = max(0, self.open - taken)
            self._release(key, taken)

    def give_back(self, key: bytes | None, size: int) -> None:
        """The Frontend read a frame of `size` bytes from connection `key` (None: a
        CURVE connection, which the gate cannot name). A named connection that holds
        nothing was never counted (a frame from an in-process link, not the gate, or
        one the settling wrote off): nothing is given back for it."""
        with self._lock:
            if key is not None and key not in self._own:
                return
            self._release(key, cost(size))

    def _release(self, key: bytes | None, back: int) -> None:
        self.held = max(0, self.held - back)
        own = self._own.get(key) if key is not None else None
        if own is not None:
            if own > back:
                self._own[key] = own - back  # type: ignore[index]
            else:
                del self._own[key]  # type: ignore[arg-type]

    def settle_if_idle(self) -> int:
        """The Frontend's socket is empty: write off what is still held if the gate
        passed nothing on for `idle` seconds (frames libzmq discarded). The bytes written off."""
        with self._lock:
            if not self.held and not self._own:
                return 0
            if self.open or self.clock() - self._last_pass < self.idle:
                return 0  # a message in progress is held for real (libzmq has its parts)
            written, self.held = self.held, 0
            self._own.clear()
            self.settled += written
            return written

    def refusal(self, size: int) -> int:
        """Count a refused frame of `size` bytes; the refusals so far."""
        with self._lock:
            self.refused += 1
            self.refused_bytes += size
            return self.refused

    def figures(self) -> dict[str, float]:
        """The counters, for /metrics."""
        return {
            "fsd_inbound_held_bytes": float(self.held),
            "fsd_inbound_refused_frames": float(self.refused),
            "fsd_inbound_refused_bytes": float(self.refused_bytes),
            "fsd_inbound_settled_bytes": float(self.settled),
        }
