"""N replicas behind one face: every job runs on one replica, its tokens are the ones a
single engine gives, and the verbs (abort, retune, snapshots) reach the right one."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest

from fsd import protocol as P
from fsd.admission import JobRequest
from fsd.cluster.face import LeastLive, ReplicaSetFace
from fsd.cluster.start import cpu_share, start_replicas
from fsd.config import EngineConfig
from fsd.engine.core import Engine
from fsd.engine.face import EngineFace
from fsd.errors import FsdError, PromptTooLongError, SettingError, UnknownJobError
from fsd.jobs import SamplingParams
from fsd.metrics import SLOWindow
from fsd.server.publish.telemetry import wire_snapshot

CONFIG = dict(model="tiny", device="cpu", num_gpu_blocks=64, profile="opt-13b-a100", threads=1)
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0)
PROMPTS = [[5 + i, 6, 7, 8 + i] for i in range(6)]


@pytest.fixture(scope="module")
def pair():
    face = start_replicas(EngineConfig.from_kwargs(**CONFIG), 2, in_process=True)
    yield face
    face.close()


def run(face: ReplicaSetFace | EngineFace, ids: list[str], limit: float = 60.0) -> dict:
    """Step until every job in `ids` finished: each job's token ids and its result."""
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    done: dict = {}
    deadline = time.monotonic() + limit
    while len(done) < len(ids):
        assert time.monotonic() < deadline, f"unfinished: {set(ids) - set(done)}"
        for d in face.step().deltas:
            tokens[d.job_id].extend(d.new_token_ids)
            if d.finished:
                done[d.job_id] = d.output
    return {i: (tokens[i], done[i]) for i in ids}


def test_jobs_spread_over_the_replicas_and_give_a_single_engines_tokens(pair):
    single = EngineFace(Engine(EngineConfig.from_kwargs(**CONFIG)))
    want = run(single, [single.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS])
    single.close()
    ids = [pair.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS]
    assert len(set(ids)) == len(ids) and pair.live() == len(ids) and pair.busy()
    placed = {i: pair.replica_of(i) for i in ids}
    assert set(placed.values()) == {0, 1}, placed  # the least-loaded router uses both
    assert {d[1]: d[2] for d in pair.decisions if d[1] in placed} == placed  # and says so
    got = run(pair, ids)
    assert [got[i][0] for i in ids] == [tokens for tokens, _ in want.values()]
    assert all(out.finish_reason == "length" for _, out in got.values())
    assert pair.live() == 0 and not pair.busy()


def test_abort_reaches_the_jobs_replica_and_unknown_ids_are_refused(pair):
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    job = pair.admit(JobRequest([5, 6, 7], long)).job_id
    assert pair.has(job) and pair.job(job).job_id == job
    out = pair.abort(job)
    assert out.finish_reason == "abort" and not pair.has(job)
    with pytest.raises(UnknownJobError):
        pair.abort(job)
    with pytest.raises(PromptTooLongError):  # checked here, before any replica sees it
        pair.admit(JobRequest([5] * (pair.info.max_model_len + 1), PARAMS))
    with pytest.raises(FsdError, match="already in use"):
        pair.admit(JobRequest([5], long, job_id="twice"))
        pair.admit(JobRequest([5], long, job_id="twice"))
    pair.abort("twice")
    run(pair, [])


def test_retune_applies_to_every_replica_or_none(pair):
    config = pair.retune(policy="fcfs", max_batch_size=4)
    assert config.sched.policy == "fcfs"
    assert {c.sched.policy for c in pair.replicas.call_all("config").values()} == {"fcfs"}
    with pytest.raises(SettingError):
        pair.retune(policy="nope")
    assert {c.sched.max_batch_size for c in pair.replicas.call_all("config").values()} == {4}
    pair.retune(policy="default", max_batch_size=32)


def test_the_snapshot_sums_the_pools_and_lists_every_replicas_jobs(pair):
    long = SamplingParams(max_tokens=300, ignore_eos=True)
    ids = [pair.admit(JobRequest([5, 6, 7, 8], long)).job_id for _ in range(4)]
    try:
        _the_snapshot_sums_the_pools(pair, ids)
    finally:
        for i in ids:
            pair.abort(i)


def _the_snapshot_sums_the_pools(pair: ReplicaSetFace, ids: list[str]) -> None:
    deadline = time.monotonic() + 30.0
    snap = pair.snapshot()
    # pushed views lag a step or a few: the new jobs may be missing, ended ones still there
    while sorted(j.job_id for j in snap.jobs) != sorted(ids) or snap.live != len(ids):
        assert time.monotonic() < deadline, f"the views never showed just {ids}"
        pair.step()
        snap = pair.snapshot()
    parts = pair.replicas.call_all("snapshot", time.time(), False).values()
    assert snap.kv.device_total == sum(p.kv.device_total for p in parts) == 128
    assert snap.live == sum(p.live for p in parts) == 4
    assert sorted(j.job_id for j in snap.jobs) == sorted(ids)
    assert sorted(i for lv in snap.sched.levels for i in lv.job_ids) == sorted(ids)
    assert [r.index for r in snap.replicas] == [0, 1]
    assert sum(r.live for r in snap.replicas) == 4 and {r.health for r in snap.replicas} == {"ok"}
    routed = {r.job_id: r.replica for r in snap.routes}
    assert all(routed[i] == pair.replica_of(i) for i in ids)
    wire = msgspec.msgpack.decode(
        msgspec.msgpack.encode(wire_snapshot(snap, SLOWindow(60.0, 0.1), 1)), type=P.Snapshot
    )
    assert wire.replicas == snap.replicas and wire.routes[-1].why.startswith("least live")
    light = pair.snapshot(detail=False)  # a status reply's: the sums, no walk of a queue
    assert (light.live, light.running, light.sched.levels) == (4, snap.running, [])
    counts = pair.level_counts()  # the stats line's, over both replicas
    assert sum(r + w for r, w in counts.values()) == 4
    assert sum(r for r, _ in counts.values()) == snap.running


def test_a_cpu_replica_gets_its_share_of_the_cores():
    assert [cpu_share(2, 2), cpu_share(16, 2), cpu_share(16, 4), cpu_share(1, 3)] == [1, 7, 3, 1]


def test_the_preview_runs_every_replica_forward(pair):
    from fsd.twin.forward import preview

    ids = [pair.admit(JobRequest([5, 6, 7, 8], SamplingParams(max_tokens=100))).job_id for _ in range(4)]
    snaps = pair.history(0.1)
    assert len(snaps) == 2 and sum(len(s.live) for s in snaps) == 4
    reply = preview(snaps, {"policy": "fcfs"}, 5.0, 2)
    assert reply.assumptions.live_jobs == 4 and "2 replicas" in reply.assumptions.notes[0]
    assert reply.current.finished.mean >= 0 and reply.proposed is not None
    for i in ids:
        pair.abort(i)


def test_a_replica_that_dies_loses_no_job_silently_and_comes_back():
    """Its waiting jobs run elsewhere with the same tokens; its started job ends with
    the error; the router avoids it until a fresh copy is up, retuned as the others."""
    face = start_replicas(EngineConfig.from_kwargs(**CONFIG, max_batch_size=1), 2, in_process=True)
    try:
        face.retune(policy="fcfs")
        first = face.admit(JobRequest(PROMPTS[0], PARAMS)).job_id
        while face.replica_of(first) is not None and not any(
            d.job_id == first and d.new_token_ids for d in face.step().deltas
        ):
            pass
        victim = face.replica_of(first)
        queued = [face.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS[1:]]
        moved = [j for j in queued if face.replica_of(j) == victim]
        face.replicas.kill(victim)
        got = run(face, [first, *queued])
        assert got[first][1].finish_reason == "error"
        assert f"replica {victim} failed" in got[first][1].error
        want = run_single(PROMPTS[1:])
        assert [got[j][0] for j in queued] == want and moved  # the moved ones too
        assert victim in face.replicas.down
        assert face.snapshot().replicas[victim].health.startswith("down: ")
        deadline = time.monotonic() + 60
        while victim in face.replicas.down:
            assert time.monotonic() < deadline, "the replica never came back"
            face.step()
        assert face.replicas.call(victim, "config").sched.policy == "fcfs"  # caught up
        assert {r.health for r in face.snapshot().replicas} == {"ok"}
    finally:
        face.close()


def run_single(prompts: list[list[int]]) -> list[list[int]]:
    """What one engine gives these prompts (greedy: the tokens any replica gives)."""
    single = EngineFace(Engine(EngineConfig.from_kwargs(**CONFIG)))
    try:
        out = run(single, [single.admit(JobRequest(p, PARAMS)).job_id for p in prompts])
        return [tokens for tokens, _ in out.values()]
    finally:
        single.close()


class Recording(LeastLive):
    """The fallback router, remembering each request's affinity key."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.keys: list[str | None] = []

    def choose(self, job_id, prompt, affinity, avoid):  # type: ignore[no-untyped-def]
        self.keys.append(affinity)
        return super().choose(job_id, prompt, affinity, avoid)


def test_the_affinity_key_reaches_the_router_from_the_sdk_and_http():
    from fsd.client.base import build_submit
    from fsd.server.http.openai_schema import parse_completion

    assert build_submit("r", "hi", None, {}, (), "user-42").affinity == "user-42"
    assert parse_completion({"prompt": "x", "user": "user-7"}, "tiny").user == "user-7"
    chooser = Recording(2)
    face = start_replicas(EngineConfig.from_kwargs(**CONFIG), 2, chooser=chooser, in_process=True)
    try:
        job = face.admit(JobRequest([5, 6], PARAMS, affinity="user-42")).job_id
        run(face, [job])
        assert chooser.keys == ["user-42"]
    finally:
        face.close()


def test_a_retune_may_name_one_replica_and_a_one_replica_face_refuses_others(pair):
    config = pair.retune(1, policy="fcfs")
    assert config.sched.policy == "fcfs"
    policies = {i: c.sched.policy for i, c in pair.replicas.call_all("config").items()}
    assert policies == {0: pair.replica_configs[0].sched.policy, 1: "fcfs"} and policies[0] != "fcfs"
    with pytest.raises(SettingError, match="no replica 5"):
        pair.retune(5, policy="fcfs")
    pair.retune(None, policy="default")
    single = EngineFace(Engine(EngineConfig.from_kwargs(**CONFIG)))
    try:
        assert single.retune(0, policy="fcfs").sched.policy == "fcfs"
        with pytest.raises(SettingError, match="one replica"):
            single.retune(1, policy="fcfs")
    finally:
        single.close()


def test_draining_a_replica_moves_its_waiting_jobs_and_sends_new_ones_elsewhere():
    face = start_replicas(EngineConfig.from_kwargs(**CONFIG, max_batch_size=1), 2, in_process=True)
    try:
        ids = [face.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS]
        on_one = [j for j in ids if face.replica_of(j) == 1]
        detail = face.drain_replica(1)
        assert detail["replica"] == 1 and detail["moved"] + detail["staying"] == len(on_one)
        assert detail["moved"] >= len(on_one) - 1  # all but the one running there, if any
        assert face.admit(JobRequest([5, 6], PARAMS)).job_id and face.replica_of(
            face.decisions[-1][1]
        ) == 0  # a new job goes to replica 0
        got = run(face, [*ids, face.decisions[-1][1]])
        assert [got[j][0] for j in ids] == run_single(PROMPTS)  # the same tokens, moved or not
        assert face.moves.moved == detail["moved"] + 0  # (the rebalancer moved none back)
        health = {r.index: r.health for r in face.snapshot().replicas}
        assert health == {0: "ok", 1: "draining"}
        face.undrain_replica(1)
        assert {r.health for r in face.snapshot().replicas} == {"ok"}
    finally:
        face.close()


def test_an_idle_replica_takes_waiting_jobs_from_a_busy_one():
    face = start_replicas(EngineConfig.from_kwargs(**CONFIG, max_batch_size=1), 2, in_process=True)
    try:
        face.drain_replica(1)  # everything lands on replica 0 ...
        ids = [face.admit(JobRequest(p, PARAMS)).job_id for p in PROMPTS]
        assert {face.replica_of(j) for j in ids} == {0}
        face.undrain_replica(1)  # ... then replica 1 is idle: the rebalancer evens them out
        got = run(face, ids)
        assert face.moves.moved >= 2
        assert [got[j][0] for j in ids] == run_single(PROMPTS)
    finally:
        face.close()


def test_the_replica_set_has_the_face_the_daemon_is_typed_for():
    from fsd.engine.face_protocol import Face

    face = start_replicas(EngineConfig.from_kwargs(**CONFIG), 2, in_process=True)
    try:
        assert isinstance(face, Face)
    finally:
        face.close()


def test_the_fsd_router_sends_a_cached_prefix_back_to_the_replica_that_holds_it():
    from fsd.config import ClusterConfig

    cluster = ClusterConfig(replicas=2, router="fsd")
    face = start_replicas(EngineConfig.from_kwargs(**CONFIG), 2, cluster=cluster, in_process=True)
    try:
        shared = [7] * 96  # six full blocks of 16 tokens
        first = face.admit(JobRequest(shared + [9], PARAMS)).job_id
        home = face.replica_of(first)
        run(face, [first])
        # the replicas push their states (with the cached blocks) as they come: until the
        # router's view of the home replica names its six blocks (a loaded machine is slow)
        until = time.monotonic() + 30.0
        while len(face.chooser.router.views[home].index) < 6:
            assert time.monotonic() < until, "the home replica's cached blocks never arrived"
            face.step()
        again = face.admit(JobRequest(shared + [10], PARAMS)).job_id
        assert face.replica_of(again) == home  # both idle: the cached prefix decides
        assert "cached 6 dev" in face.decisions[-1][3]
        run(face, [again])
    finally:
        face.close()


def test_a_hung_replica_holds_nobody_and_is_replaced():
    """A replica that stops answering (as SIGSTOP makes it): status, job lists and
    aborts are answered at once from what the replicas pushed, the hung one is marked
    down within a few seconds, its waiting jobs finish elsewhere and a fresh copy comes."""
    face = start_replicas(EngineConfig.from_kwargs(**CONFIG, max_batch_size=1), 2, in_process=True)
    stop = threading.Event()
    try:
        long = SamplingParams(max_tokens=400, ignore_eos=True)
        ids = [face.admit(JobRequest(p, long)).job_id for p in PROMPTS[:4]]
        while not face.snapshot().jobs or len(face.snapshot().jobs) < 4:
            face.step()
        victim = 1
        hung = face.replicas.workers[victim]
        step = hung.face.step
        hung.poll = lambda timeout=0.0: stop.wait()  # type: ignore[method-assign]
        hung.face.step = lambda: (stop.wait(), step())[1]  # type: ignore[method-assign]
        began = time.monotonic()
        answered = []
        while victim not in face.replicas.down:
            assert time.monotonic() - began < 30, "the hung replica was never marked down"
            t0 = time.monotonic()
            snap = face.snapshot(detail=False)
            assert len(face.jobs()) >= 1 and snap.live >= 1
            answered.append(time.monotonic() - t0)
            face.step()
        print(f"marked down after {time.monotonic() - began:.1f} s; status took {max(answered):.3f} s at most")
        assert max(answered) < 5.0  # never a step-wait on the hung one
        assert "unanswered" in face.replicas.down[victim]
        rest = [j for j in ids if face.has(j)]
        out = face.abort(rest[0])  # told, answered at once with what it made so far
        assert out.finish_reason == "abort"
        deadline = time.monotonic() + 60
        while victim in face.replicas.down:
            assert time.monotonic() < deadline, "no fresh copy came"
            face.step()
        assert {r.health for r in face.snapshot().replicas} == {"ok"}
    finally:
        stop.set()
        face.close()
