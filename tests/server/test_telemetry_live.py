"""The engine times its iterations for live cost, and telemetry carries what the
scheduler learned: each job's rank, the output lengths of finished jobs, the scale.

A real engine (the tiny preset) runs the iterations; snapshots are built as the
daemon builds them and go over the wire (msgpack, and JSON as recordings hold them).
Frames without the new fields (an older daemon) still decode, and an older client
skips them.
"""

from __future__ import annotations

import time

import msgspec
import pytest

from fsd import protocol as P
from fsd.client import read_recording
from fsd.config import EngineConfig
from fsd.cost.calibration import MAX_RATIO, MIN_RATIO
from fsd.engine.core import Engine
from fsd.engine.face import EngineFace
from fsd.jobs import SamplingParams
from fsd.metrics import SLOWindow
from fsd.server.publish.telemetry import build_snapshot
from tests.console.conftest import RECORDING
from tests.costs import linear_cost

# about the tiny model's own times on a CPU, within the clamp whatever the machine
COST = linear_cost("live", prefill=(2e-3, 2e-5), decode=(2e-3, 1e-5, 1e-8))


def timed_engine(**options: object) -> Engine:
    config = EngineConfig.from_kwargs(model="tiny", device="cpu", num_gpu_blocks=128, **options)
    e = Engine(config, cost=COST)  # no start-up profile (quick tests)...
    assert not e.measure_cost  # (a cost handed in is charged as given)
    e.measure_cost = True  # ...but the iterations are timed as with one
    return e


@pytest.fixture(scope="module")
def engine():
    # MLFQ charges `attained`; large quanta: no demotion resets it while a test reads it
    e = timed_engine(policy="sj-mlfq", quanta=(10.0, 20.0, 40.0))
    yield e
    e.close()


@pytest.fixture(scope="module")
def default_engine():
    e = timed_engine()  # the default policy
    yield e
    e.close()


def run(engine: Engine) -> None:
    while engine.has_unfinished():
        engine.step()


def test_each_iteration_is_timed_and_service_is_charged_in_measured_seconds(engine):
    sched = engine.scheduler
    seen: list[tuple[float, float]] = []
    observe = sched.observe_iteration
    sched.observe_iteration = lambda p, m: (seen.append((p, m)), observe(p, m))  # type: ignore[method-assign]
    try:
        before = engine.iterations
        job = engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=6, ignore_eos=True))
        engine.step()  # the prefill
        charged = []
        while not job.status.finished:
            attained = job.attained
            engine.step()
            if not job.status.finished:
                charged.append((job.attained - attained, job.last_cost * sched.live_cost.scale))
    finally:
        del sched.observe_iteration
    assert len(seen) == engine.iterations - before == 6  # every iteration, once
    for predicted, measured in seen:
        assert predicted > 0 and measured > 0
    # a decode step alone was predicted at decode(1, context) (no other job ran)
    assert seen[-1][0] == pytest.approx(COST.decode_time(1, job.num_tokens - 1))
    # the model step is part of the iteration the engine reports (scheduling is not)
    assert seen[-1][1] <= engine.last_iteration.duration
    assert sched.live_cost.samples >= 6 and MIN_RATIO <= sched.live_cost.scale <= MAX_RATIO
    for got, want in charged:  # each decode: the prediction x the scale learned so far
        assert got == pytest.approx(want)


def snapshot(engine: Engine, json: bool = False) -> P.Snapshot:
    snap = build_snapshot(EngineFace(engine), SLOWindow(60.0, 0.1), 1, time.time())
    if json:  # as `fsctl record` writes it and `fsctl top --replay` reads it
        return msgspec.json.decode(msgspec.json.encode(snap), type=P.Snapshot)
    return P.decode_snapshot(P.encode(snap))


@pytest.mark.parametrize("which", ["engine", "default_engine"])
def test_snapshots_carry_ranks_learned_lengths_and_the_live_cost(which, request):
    engine = request.getfixturevalue(which)
    finished = [
        engine.add_request([9, k], SamplingParams(max_tokens=2 + k, ignore_eos=True))
        for k in range(4)
    ]
    run(engine)
    assert all(j.status.finished for j in finished)
    waiting = [
        engine.add_request([3] * (4 + k), SamplingParams(max_tokens=5, ignore_eos=True))
        for k in range(5)
    ]
    engine.step()
    order = [j.job_id for j in engine.scheduler.queue.ordered()]
    assert sorted(order) == sorted(j.job_id for j in waiting)
    for snap in (snapshot(engine), snapshot(engine, json=True)):
        ranks = {j.job_id: j.rank for j in snap.jobs or []}
        assert [ranks[i] for i in order] == [1, 2, 3, 4, 5]  # 1-based, in the queue's order
        info = snap.sched
        assert info is not None
        assert info.live_cost == pytest.approx(engine.scheduler.live_cost.scale)
        assert info.live_cost_samples == engine.scheduler.live_cost.samples > 0
        learned = info.learned
        assert learned is not None and learned.samples >= 4
        assert dict(learned.quantiles)[0.5] in (2, 3, 4, 5, 6)
    # fsctl jobs and job read the same rows, ranked the same way
    rows = EngineFace(engine).jobs(time.time())
    assert {r.job_id: r.rank for r in rows} == ranks
    row = EngineFace(engine).job(waiting[0].job_id)
    assert row.rank == ranks[waiting[0].job_id]
    run(engine)


def test_frames_without_the_new_fields_decode_and_old_clients_skip_them():
    row = P.JobInfo(
        job_id="j", state="waiting", level=1, kv="none", blocks=0, host_blocks=0, enst=None,
        prompt_tokens=4, output_tokens=0, waited=0.0, attained=0.0, arrival=1.0,
    )  # fmt: skip
    assert b"rank" not in msgspec.msgpack.encode(row)  # None: left out, as before
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(row), type=P.JobInfo).rank is None
    ranked = msgspec.msgpack.encode(msgspec.structs.replace(row, rank=3))

    class OldRow(msgspec.Struct, kw_only=True):  # a client built before `rank`
        job_id: str
        level: int

    assert msgspec.msgpack.decode(ranked, type=OldRow) == OldRow(job_id="j", level=1)
    sched = P.SchedInfo(
        live_cost=12.5,
        live_cost_samples=40,
        learned=P.LearnedInfo(samples=3, ready=False, mean=7.0, quantiles=[(0.5, 6)]),
    )
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(sched), type=P.SchedInfo)
    assert back == sched and back.learned.by_prompt == []  # type: ignore[union-attr]
    assert msgspec.msgpack.decode(b"\x80", type=P.SchedInfo) == P.SchedInfo()  # {}: defaults


def test_a_recording_from_a_daemon_before_them_reads_as_not_reported():
    snaps = [m for m in read_recording(RECORDING) if isinstance(m, P.Snapshot)]
    assert snaps and all(s.sched is None for s in snaps)
    assert all(j.rank is None for s in snaps for j in s.jobs or [])
