"""The twin's snapshot: the live scheduler, frozen into bytes between two iterations.

Design. The simulator runs the engine's own scheduler and block manager, so the
most faithful copy of the live state is the scheduler object itself: every job's
level, attained service, FIFO place and starvation clock, the policy's learned
lengths and guard, the block tables on both tiers, the prefix cache, the copies in
flight, the live cost scale. The snapshot pickles it, and the pickler swaps each
engine `Job` (token ids, sampling parameters, detokenizer state) for a `SimJob`
carrying the same scheduling state and its token counts: the simulator's job. One
pass on the engine thread, no deep copy; the bytes then travel to a separate process
where each run unpickles its own copy (fsd.twin.forward).

What a snapshot cannot know is what has not happened: how many tokens each job
will still produce (`LiveJob`: exact when it ignores EOS and has no stop, otherwise
drawn per run from recent jobs), and what will arrive (fsd.engine.history's fits).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import time
from dataclasses import dataclass, field
from typing import Any

from fsd.config import CacheConfig, SchedConfig
from fsd.engine.history import ArrivalFit, Clock, WorkHistory
from fsd.jobs import Job
from fsd.sched.scheduler import Scheduler
from fsd.sim.job import SimJob

# Job fields a SimJob does not take over: the tokens themselves and what makes them
_DROP = frozenset(
    ("prompt_token_ids", "output_token_ids", "params", "prompt", "token_times",
     "max_output", "oracle_output_len", "num_tokens")
)  # fmt: skip
_FIELDS = tuple(f.name for f in dataclasses.fields(Job))  # Job has slots, no __dict__


@dataclass(frozen=True)
class LiveJob:
    """A job in the daemon at the snapshot: its output so far and what bounds the rest."""

    job_id: str
    generated: int
    max_output: int
    exact: bool  # it runs to max_output (ignores EOS, no stop): nothing to draw
    preemptions: int = 0  # so far (a run reports those after the snapshot)
    swaps: int = 0


@dataclass(frozen=True)
class TwinSnapshot:
    """Everything a preview needs, picklable and independent of the engine."""

    taken_at: float  # wall clock (the jobs' times are on it too)
    scheduler: bytes  # the pickled Scheduler, SimJobs for Jobs
    live: tuple[LiveJob, ...]
    sched: SchedConfig  # the settings now (a proposal is applied to these)
    cache: CacheConfig
    arrivals: ArrivalFit
    lengths: tuple[tuple[int, int, bool], ...]  # recent (prompt, output, natural stop)
    clock: Clock
    slo: float  # per-token seconds
    notes: tuple[str, ...] = field(default=())


def _sim_job(state: dict[str, Any]) -> SimJob:
    """Rebuild a live job as a SimJob (the snapshot's pickler names this)."""
    job = SimJob(state["job_id"], state["arrival_time"], state["prompt_len"], state["total"])
    for name, value in state["fields"].items():  # Job has slots: no __dict__ to update
        setattr(job, name, value)
    job.num_tokens = state["prompt_len"] + state["generated"]
    job.output_count = state["generated"]
    job.last_token_time = state["last_token_time"]
    return job


class _TwinPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not Job:
            return NotImplemented
        times = obj.token_times
        state = {
            "job_id": obj.job_id,
            "arrival_time": obj.arrival_time,
            "prompt_len": obj.num_prompt_tokens,
            "generated": obj.num_output_tokens,
            "total": obj.max_output,  # a forward run sets the drawn length
            "last_token_time": times[-1] if times else 0.0,
            "fields": {f: getattr(obj, f) for f in _FIELDS if f not in _DROP},
        }
        return _sim_job, (state,)


def _live(job: Job) -> LiveJob:
    p = job.params
    exact = p.ignore_eos and not p.stop and not p.stop_token_ids
    swaps = job.swaps_out + job.swaps_in
    return LiveJob(job.job_id, job.num_output_tokens, job.max_output, exact, job.preemptions, swaps)


def take_snapshot(
    scheduler: Scheduler,
    history: WorkHistory,
    sched: SchedConfig,
    cache: CacheConfig,
    slo: float,
    now: float | None = None,
) -> TwinSnapshot:
    """Freeze the live state now (call between iterations, on the engine thread)."""
    now = time.time() if now is None else now
    buf = io.BytesIO()
    _TwinPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(scheduler)
    live = tuple(_live(j) for j in scheduler.jobs())
    return TwinSnapshot(
        taken_at=now,
        scheduler=buf.getvalue(),
        live=live,
        sched=sched,
        cache=cache,
        arrivals=history.arrival_fit(now),
        lengths=tuple(history.lengths()),
        clock=history.clock(),
        slo=slo,
    )


def restore(snapshot: TwinSnapshot) -> Scheduler:
    """A fresh, independent copy of the snapshot's scheduler (SimJobs inside)."""
    sched = pickle.loads(snapshot.scheduler)  # noqa: S301 - our own bytes, never a peer's
    assert isinstance(sched, Scheduler)
    return sched
