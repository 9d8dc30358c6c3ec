"""The daemon log's periodic stats line: what the engine did since the last one.

Every `stats_interval` seconds in which there was work (iterations ran, jobs ended
or jobs are live), one INFO line on the `fsd.server` logger, e.g.

    stats 10.0 s: 48.2 it/s, 812 gen tok/s, 3400 prompt tok/s, 40 finished;
    jobs Q1 4/10 Q2 0/3 (running/waiting); KV device 72% host 10%;
    prefix hits 35% of 12000 tokens; swaps 3 out 2 in; 12 refused as overloaded

(one line in the log; the refusals only when there were some: refuse_wait or
refuse_late). It counts nothing the engine already keeps: iterations are
the engine snapshot's count, prompt tokens the iterations' own `IterationStats`,
occupancy the block pools' `stats()`, prefix hits the prefix cache's counters (their
change over the interval), swaps and refusals the engine's events (a `TelemetryPump`
tap); only the
generated tokens and finished jobs are summed here, from the loop's step deltas.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from fsd.engine.events import EngineEvent, wire_level
from fsd.engine.face_protocol import Face
from fsd.engine.views import EngineSnapshot, Stepped

log = logging.getLogger("fsd.server")

_SWAPS = {"swap-out-begin": "out", "swap-in-begin": "in"}


class StatsLog:
    """The loop's stats duty: `stepped` after each step, `tick` every pass."""

    def __init__(
        self, face: Face, interval: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`interval`: seconds between two lines (0: none)."""
        self.face = face
        self.interval = interval
        self._clock = clock
        self._start(clock())

    def _start(self, now: float, snap: EngineSnapshot | None = None) -> None:
        """Begin a new interval at `now` (from `snap`, the engine's state now)."""
        snap = snap or self.face.snapshot(with_jobs=False, detail=False)
        prefix = snap.prefix
        self._since = now
        self._iterations = snap.iteration_count
        self._prefix = (prefix.lookups, prefix.lookup_hits)
        self._prompt = self._generated = self._finished = 0
        self._swaps: Counter[str] = Counter()
        self._refused = 0

    def stepped(self, step: Stepped) -> None:
        """One step's tokens and finished jobs, and its iterations' prompt tokens."""
        for d in step.deltas:
            self._generated += len(d.new_token_ids)
            self._finished += d.finished
        for it in step.iterations:  # a step completes one iteration or a few
            self._prompt += it.prefill_tokens

    def saw_events(self, events: list[EngineEvent]) -> None:
        """Count the swaps and refusals among the engine's events (a `TelemetryPump` tap)."""
        for e in events:
            self._refused += e.kind == "refuse"
            direction = _SWAPS.get(e.kind)
            if direction is not None:
                self._swaps[direction] += 1

    def tick(self) -> None:
        """Log the line once the interval is over (if there was work), then start anew."""
        if self.interval <= 0:
            return
        now = self._clock()
        if now - self._since < self.interval:
            return
        snap = self.face.snapshot(with_jobs=False, detail=False)
        ran = snap.iteration_count - self._iterations
        if ran or self._finished or snap.live or self._refused:
            log.info("%s", self.line(now - self._since, snap, self.face.level_counts()))
        self._start(now, snap)

    def line(self, span: float, snap: EngineSnapshot, levels: dict[int, tuple[int, int]]) -> str:
        """The stats of the `span` seconds since the interval began, up to `snap`."""
        rate = f"{(snap.iteration_count - self._iterations) / span:.1f} it/s, "
        rate += f"{self._generated / span:.0f} gen tok/s, {self._prompt / span:.0f} prompt tok/s"
        kv = snap.kv
        host = f"{100 * kv.host_used / kv.host_total:.0f}%" if kv.host_total else "-"
        return (
            f"stats {span:.1f} s: {rate}, {self._finished} finished; "
            f"jobs {_levels(levels)} (running/waiting); "
            f"KV device {100 * kv.device_used / max(kv.device_total, 1):.0f}% host {host}; "
            f"{self._prefix_hits(snap)}; swaps {self._swaps['out']} out {self._swaps['in']} in"
            + (f"; {self._refused} refused as overloaded" if self._refused else "")
        )

    def _prefix_hits(self, snap: EngineSnapshot) -> str:
        """'prefix hits 35% of 12000 tokens' over the interval (or why there is no rate)."""
        stats = snap.prefix
        if not stats.enabled:
            return "prefix cache off"
        queries, hits = stats.lookups - self._prefix[0], stats.lookup_hits - self._prefix[1]
        if not queries:
            return "prefix hits - (no prompt looked up)"
        return f"prefix hits {100 * hits / queries:.0f}% of {queries} tokens"


def _levels(counts: dict[int, tuple[int, int]]) -> str:
    """'Q1 4/10 Q2 0/3': running and waiting jobs of each level that has any (1-based)."""
    ordered = sorted(counts.items())
    return " ".join(f"Q{wire_level(q)} {r}/{w}" for q, (r, w) in ordered) or "none"
