"""The console's data layer: telemetry folded into plain data, no widgets here.

`TopState` folds every snapshot and event (in arrival order) into the latest
state, ring buffers for the sparklines and a bounded per-job history; `view()`
hands the UI an immutable `TopView` it can render on another thread. The job
table is the expensive part with 10k jobs: it is converted once per table the
daemon sends (`Snapshot.jobs` may be None; the last table is kept and its rows
follow the level queues, which every snapshot carries).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

from fsd import protocol as P
from fsd.client import generation_rate

HISTORY = 120  # points per sparkline
JOB_HISTORY = 64  # transitions / token samples kept per job
ENDED_KEPT = 500  # histories of ended jobs kept for the detail screen
TOP_LEVEL = 1  # Q1: levels are 1-based on the wire (protocol v2) and in the console


class JobRow(NamedTuple):
    """One job of the table, as plain data (level follows the latest snapshot).

    Levels are 1-based here as on the wire (1 = Q1, the top level): shown as is.
    """

    job_id: str
    level: int
    state: str
    kv: str
    enst: float | None
    prompt_tokens: int
    prefilled: int | None  # prompt tokens with cached KV (None: the daemon does not say)
    output_tokens: int
    waited: float
    attained: float
    arrival: float
    blocks: int
    host_blocks: int
    tags: tuple[str, ...]
    injected: bool
    in_table: bool  # False: seen in a level queue, not yet in a job table
    enst_order: float  # ENST, unknown last: a plain float sorts 10k rows in C
    prefill_order: float  # prompt tokens left to prefill if part done, else last
    rank: int | None  # place in the scheduler's order, 1 runs first (None: not reported)
    rank_order: float  # the rank, unknown last

    @classmethod
    def of(cls, j: P.JobInfo, inject_tags: frozenset[str]) -> JobRow:
        tags = tuple(j.tags)
        done, prompt = j.prefilled, j.prompt_tokens
        left = prompt - done if done is not None and 0 < done < prompt else math.inf
        return cls(
            j.job_id, j.level, j.state, j.kv, j.enst, prompt, done, j.output_tokens,
            j.waited, j.attained, j.arrival, j.blocks, j.host_blocks, tags,
            not inject_tags.isdisjoint(tags), True, math.inf if j.enst is None else j.enst,
            left, j.rank, math.inf if j.rank is None else j.rank,
        )  # fmt: skip

    @classmethod
    def pending(cls, job_id: str, level: int) -> JobRow:
        """A job the levels list but no job table has described yet."""
        return cls(job_id, level, "new", "-", None, 0, None, 0, 0.0, 0.0, math.inf, 0, 0, (), False, False, math.inf, math.inf, None, math.inf)  # fmt: skip


# Sortable columns: name → key (attrgetter keys run in C: 10k rows sort in a few ms).
SORT_KEYS: dict[str, Callable[[JobRow], Any]] = {
    "enst": attrgetter("enst_order", "arrival"),  # first: who runs next
    "id": attrgetter("arrival", "job_id"),
    "level": attrgetter("level", "enst_order"),
    "rank": attrgetter("rank_order", "arrival"),  # the scheduler's own order
    "state": attrgetter("state", "level"),
    "kv": attrgetter("kv", "level"),
    "tokens": attrgetter("output_tokens", "prompt_tokens"),
    "prefill": attrgetter("prefill_order", "arrival"),  # closest to its first token first
    "waited": attrgetter("waited"),
    "attained": attrgetter("attained"),
}


def sort_rows(rows: Iterable[JobRow], key: str, reverse: bool = False) -> list[JobRow]:
    return sorted(rows, key=SORT_KEYS[key], reverse=reverse)


class Transition(NamedTuple):
    """A job's (state, level) from `time` on, and what told us (an event kind or 'table')."""

    time: float
    state: str
    level: int
    cause: str


@dataclass
class JobHistory:
    """What the console saw of one job: state/level changes and output-token samples."""

    job_id: str
    transitions: deque[Transition] = field(default_factory=lambda: deque(maxlen=JOB_HISTORY))
    tokens: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=JOB_HISTORY))
    info: P.JobInfo | None = None
    ended: str | None = None  # "finished: length", "aborted", ...

    def note(self, t: float, state: str, level: int, cause: str) -> None:
        last = self.transitions[-1] if self.transitions else None
        if last is None or (last.state, last.level) != (state, level):
            self.transitions.append(Transition(t, state, level, cause))

    def sample(self, t: float, output_tokens: int) -> None:
        if not self.tokens or self.tokens[-1][1] != output_tokens:
            self.tokens.append((t, output_tokens))

    def per_token_latencies(self) -> list[float]:
        """Seconds per output token between consecutive samples (telemetry resolution)."""
        out = []
        pairs = list(self.tokens)
        for (t0, n0), (t1, n1) in zip(pairs, pairs[1:], strict=False):
            if n1 > n0 and t1 > t0:
                out.append((t1 - t0) / (n1 - n0))
        return out

    def copy(self) -> JobHistory:
        return JobHistory(
            self.job_id, deque(self.transitions, JOB_HISTORY), deque(self.tokens, JOB_HISTORY),
            self.info, self.ended,
        )  # fmt: skip


# Event kind → the (state, KV note) it implies for a job; level comes from the detail.
_EVENT_STATE = {
    "arrive": "waiting",
    "start": "running",
    "preempt": "preempted",
    "recompute": "waiting",
    "finish": "finished",
    "abort": "aborted",
}


@dataclass(frozen=True)
class TopView:
    """Everything one frame of the console shows; immutable, safe to hand across threads."""

    snapshot: P.Snapshot | None
    rows: tuple[JobRow, ...]
    rows_version: int  # changes whenever `rows` does (a new table or new levels)
    jobs_time: float | None  # when the daemon read the table the rows come from
    live_jobs: int  # jobs in the level queues of the latest snapshot
    iter_ms: tuple[float, ...]
    batch: tuple[float, ...]
    swap_out_rate: tuple[float, ...]  # bytes/s between consecutive snapshots
    swap_in_rate: tuple[float, ...]
    device_used: tuple[float, ...]  # fraction of the device pool
    tokens_per_s: tuple[float, ...]  # tokens generated per second (fsd.client.generation_rate)
    frames: int
    last_event: P.Event | None

    @property
    def table_age(self) -> float | None:
        """Seconds between the table's reading and the latest snapshot."""
        s = self.snapshot
        if s is None or self.jobs_time is None:
            return None
        return max(0.0, s.time - self.jobs_time)


EMPTY_VIEW = TopView(None, (), 0, None, 0, (), (), (), (), (), (), 0, None)


class TopState:
    """Folds snapshots and events into the console's model (thread-safe)."""

    def __init__(self, history: int = HISTORY, inject_tags: Iterable[str] = ("injected",)) -> None:
        self._lock = threading.Lock()
        self.inject_tags = frozenset(inject_tags)
        self.snapshot: P.Snapshot | None = None
        self.frames = 0
        self.last_event: P.Event | None = None
        self._table: dict[str, JobRow] = {}  # the latest job table, by id
        self._jobs_time: float | None = None
        self._rows: tuple[JobRow, ...] = ()
        self._rows_version = 0
        self._live_ids: frozenset[str] = frozenset()
        self._last_iter_start = -math.inf
        self._rings = {
            name: deque(maxlen=history)
            for name in ("iter_ms", "batch", "swap_out", "swap_in", "device", "tps")
        }
        self._histories: dict[str, JobHistory] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()

    # ---- folding -------------------------------------------------------------------

    def apply(self, msg: P.Snapshot | P.Event) -> None:
        with self._lock:
            self.frames += 1
            if isinstance(msg, P.Snapshot):
                self._snapshot(msg)
            else:
                self._event(msg)

    def _snapshot(self, s: P.Snapshot) -> None:
        prev = self.snapshot
        self.snapshot = s
        self._rates(prev, s)
        for it in s.iterations:
            if it.start > self._last_iter_start:
                self._last_iter_start = it.start
                self._rings["iter_ms"].append(it.duration * 1e3)
                self._rings["batch"].append(float(it.batch_size))
        level_of = {jid: lv.index for lv in s.levels for jid in lv.job_ids}
        if s.jobs is not None:
            self._fold_table(s.jobs, s.jobs_time if s.jobs_time is not None else s.time)
        live = frozenset(level_of)
        joined_or_left = live != self._live_ids
        if s.jobs is not None or joined_or_left or self._levels_moved(level_of):
            self._live_ids = live
            self._rebuild_rows(level_of)
        if joined_or_left:  # a job that left the queues without an event (events lost)
            for gone in self._histories.keys() - live - self._ended.keys():
                self._end(gone, None)

    def _rates(self, prev: P.Snapshot | None, s: P.Snapshot) -> None:
        kv = s.kv
        self._rings["device"].append(kv.device_used / kv.device_total if kv.device_total else 0.0)
        self._rings["tps"].append(generation_rate(s))  # streaming jobs count, not just ended
        if prev is None or s.time <= prev.time:
            return
        dt = s.time - prev.time
        out = max(0, kv.swapped_out_bytes - prev.kv.swapped_out_bytes)
        inn = max(0, kv.swapped_in_bytes - prev.kv.swapped_in_bytes)
        self._rings["swap_out"].append(out / dt)
        self._rings["swap_in"].append(inn / dt)

    def _fold_table(self, jobs: list[P.JobInfo], t: float) -> None:
        tags = self.inject_tags
        table = {}
        for j in jobs:
            row = JobRow.of(j, tags)
            table[j.job_id] = row
            h = self._histories.get(j.job_id)
            if h is None:
                h = self._histories[j.job_id] = JobHistory(j.job_id)
            h.info = j
            h.note(t, j.state, j.level, "table")
            h.sample(t, j.output_tokens)
        self._table = table
        self._jobs_time = t

    def _levels_moved(self, level_of: dict[str, int]) -> bool:
        return any(level_of.get(r.job_id, r.level) != r.level for r in self._rows)

    def _rebuild_rows(self, level_of: dict[str, int]) -> None:
        """Rows of the live jobs: table rows at their current level, then the unseen ones."""
        rows = []
        table = self._table
        for jid, level in level_of.items():
            row = table.get(jid)
            if row is None:
                rows.append(JobRow.pending(jid, level))
            else:
                rows.append(row if row.level == level else row._replace(level=level))
        self._rows = tuple(rows)
        self._rows_version += 1

    def _event(self, e: P.Event) -> None:
        self.last_event = e
        if e.job_id is None:
            return
        h = self._histories.get(e.job_id)
        if h is None:
            if e.job_id in self._ended:
                return  # a late event of a job whose end we already saw
            h = self._histories[e.job_id] = JobHistory(e.job_id)
        last = h.transitions[-1] if h.transitions else None
        level = int(e.detail.get("level", last.level if last else TOP_LEVEL))
        state = _EVENT_STATE.get(e.kind)
        if state is None and e.kind in ("demote", "promote"):
            state = last.state if last else "waiting"
        if state is not None:
            h.note(e.time, state, level, e.kind)
        if e.kind in ("finish", "abort"):
            reason = e.detail.get("reason")
            self._end(e.job_id, f"finished: {reason}" if reason else "aborted")

    def _end(self, job_id: str, how: str | None) -> None:
        h = self._histories.get(job_id)
        # "gone" (left the queues before its event came) is provisional: snapshots and
        # events travel as separate topics, so the finish or abort may arrive just after
        if h is not None and (h.ended is None or (h.ended == "gone" and how is not None)):
            h.ended = how or "gone"
        self._ended[job_id] = None
        while len(self._ended) > ENDED_KEPT:
            old, _ = self._ended.popitem(last=False)
            self._histories.pop(old, None)

    # ---- reading -------------------------------------------------------------------

    def view(self) -> TopView:
        with self._lock:
            r = self._rings
            s = self.snapshot
            return TopView(
                snapshot=s,
                rows=self._rows,
                rows_version=self._rows_version,
                jobs_time=self._jobs_time,
                live_jobs=len(self._live_ids),
                iter_ms=tuple(r["iter_ms"]),
                batch=tuple(r["batch"]),
                swap_out_rate=tuple(r["swap_out"]),
                swap_in_rate=tuple(r["swap_in"]),
                device_used=tuple(r["device"]),
                tokens_per_s=tuple(r["tps"]),
                frames=self.frames,
                last_event=self.last_event,
            )

    def job_history(self, job_id: str) -> JobHistory | None:
        """A copy of what the console saw of `job_id` (None if nothing)."""
        with self._lock:
            h = self._histories.get(job_id)
            return None if h is None else h.copy()

    def add_inject_tag(self, tag: str) -> None:
        """Mark jobs carrying `tag` as injected from the next table on."""
        with self._lock:
            self.inject_tags = self.inject_tags | {tag}


def fold(messages: Iterable[P.Snapshot | P.Event], state: TopState | None = None) -> TopState:
    """A state with every message folded in (recordings, tests, `--once --replay`)."""
    state = state or TopState()
    for msg in messages:
        state.apply(msg)
    return state
