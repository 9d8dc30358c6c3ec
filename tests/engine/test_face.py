"""The engine's face hands out plain values: they pickle (a replica in another process
could send them) and stay what they were when the engine moves on."""

from __future__ import annotations

import pickle

import pytest

from fsd.admission import JobRequest
from fsd.config import EngineConfig
from fsd.engine.core import Engine
from fsd.engine.face import EngineFace
from fsd.errors import SettingError, UnknownJobError
from fsd.jobs import SamplingParams
from fsd.twin.snapshot import take_snapshot
from tests.sched.harness import COST


@pytest.fixture(scope="module")
def face():
    config = EngineConfig.from_kwargs(model="tiny", device="cpu", num_gpu_blocks=64)
    f = EngineFace(Engine(config, cost=COST), events=True, snapshot=take_snapshot)
    yield f
    f.close()


def test_admit_step_and_abort_through_the_face(face):
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    a = face.admit(JobRequest([5, 6, 7, 8], params, tags=["t"]))
    b = face.admit(JobRequest([9, 10, 11], params, job_id="mine"))
    assert (a.prompt_tokens, b.job_id) == (4, "mine")
    assert face.live() == 2 and face.busy()

    step = face.step()
    assert not step.failures and step.seconds > 0
    assert len(step.iterations) == 1 and step.iterations[0].batch_size == 2
    assert {d.job_id for d in step.deltas} == {a.job_id, "mine"}

    snap = face.snapshot()
    again = pickle.loads(pickle.dumps(snap))
    assert again == snap and snap.live == 2 and snap.iteration_count >= 1
    rows = {r.job_id: r for r in snap.jobs or []}
    assert rows[a.job_id].tags == ["t"] and rows[a.job_id].level >= 1  # 1-based
    assert face.job("mine") is not None and face.job("nobody") is None

    out = face.abort("mine")
    assert out.finish_reason == "abort"
    assert rows["mine"].state != "finished"  # the row taken before is a copy
    with pytest.raises(UnknownJobError):
        face.abort("mine")
    while face.busy():
        face.step()
    assert face.live() == 0
    kinds = {e.kind for e in face.drain_events()}
    assert {"arrive", "abort", "finish"} <= kinds


def test_the_twin_history_and_the_info_are_plain(face):
    assert pickle.loads(pickle.dumps(face.info)) == face.info
    assert face.info.kv_tokens == 64 * face.config.cache.block_size
    pickle.dumps(face.history(face.info.slo))
    new = face.retune(policy="fcfs")
    assert new.sched.policy == "fcfs" == face.snapshot(with_jobs=False).sched.policy


def test_job_rows_are_one_list_per_engine_state(face):
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    face.admit(JobRequest([5, 6, 7], params))
    first = face.jobs()
    assert face.jobs() is first and len(first) == 1  # asked again: the same rows
    face.step()
    moved = face.jobs()
    assert moved is not first and moved[0].output_tokens >= 1  # a new state: new rows
    face.admit(JobRequest([8, 9], params))
    assert len(face.jobs()) == 2  # an arrival is a new state too
    while face.busy():
        face.step()
    assert face.jobs() == []


def test_a_light_snapshot_and_the_level_counts_agree_with_the_rows(face):
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    for k in range(3):
        face.admit(JobRequest([5, 6, 7 + k], params))
    face.step()
    full, light = face.snapshot(), face.snapshot(with_jobs=True, detail=False)
    assert light.jobs is None and light.sched.levels == []  # no walk of the queue
    assert (light.live, light.running) == (full.live, full.running) == (3, 3)
    counts: dict[int, list[int]] = {}
    for row in full.jobs or []:
        pair = counts.setdefault(row.level - 1, [0, 0])  # rows are 1-based
        pair[row.state != "running"] += 1
    assert face.level_counts() == {q: tuple(p) for q, p in counts.items()}
    while face.busy():
        face.step()
    assert face.level_counts() == {}


def test_the_face_has_the_shape_the_daemon_is_typed_for(face):
    """Every member of `Face` (the daemon's one view of an engine) is on EngineFace;
    tests/cluster/test_replica_set.py checks the replica set's face the same way."""
    from fsd.engine.face_protocol import Face

    assert isinstance(face, Face)
    assert not isinstance(object(), Face)  # (the check can fail)


def test_a_face_built_without_a_snapshotter_says_it_has_no_previews(face):
    bare = EngineFace(face._engine)  # the engine itself does not import the twin
    with pytest.raises(SettingError, match="without previews"):
        bare.history(face.info.slo)
