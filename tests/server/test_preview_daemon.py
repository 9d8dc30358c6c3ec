"""Previews in a real daemon: the twin's answer, a daemon left as it was, bad input
refused in retune's words, one preview at a time."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import zmq

from fsd import protocol as P
from tests.server.daemon_proc import Daemon, daemon_fixture, pool_config, raw, start_daemon

CONFIG = pool_config(48, 6, 5, client_timeout=30.0)

daemon = daemon_fixture(CONFIG, "preview")


ENDS: dict[str, tuple[str, int]] = {}  # every injected job's end seen so far


def _ask(s: zmq.Socket, msg: P.Request | None, until: tuple[type, ...], timeout: float = 240.0):
    """Send `msg`; the first reply of a type in `until` (jobs' ends kept in ENDS)."""
    if msg is not None:
        s.send(P.encode(msg))
    deadline = time.time() + timeout
    while time.time() < deadline:
        if s.poll(200):
            rep = P.decode_reply(s.recv())
            if isinstance(rep, P.Finished):
                ENDS[rep.job_id] = (rep.reason, len(rep.token_ids))
            if isinstance(rep, until):
                return rep
    raise AssertionError(f"no {until} within {timeout}s")


def _load(d: Daemon, s: zmq.Socket, count: int = 10) -> list[str]:
    """Jobs that stay long enough to be in the snapshot (this connection's)."""
    ack = _ask(s, P.Inject(token=d.token, tag="load", burst=P.Burst(count=count, input_len=60,
               output_len=120), req_id="load"), (P.Ack, P.Error))  # fmt: skip
    assert isinstance(ack, P.Ack), ack
    return list(ack.detail["job_ids"])


def test_a_preview_answers_for_both_sides_and_changes_nothing(daemon: Daemon) -> None:
    s = raw(daemon)
    ids = _load(daemon, s)
    before = first = _ask(s, P.Status(token=daemon.token), (P.StatusReply,))
    while before.iterations < first.iterations + 12:  # iterations for the twin's clock
        before = _ask(s, P.Status(token=daemon.token), (P.StatusReply,))
    change = {"policy": "fcfs", "max_batch_size": 2, "kv_policy": "recompute"}
    msg = P.Preview(token=daemon.token, changes=change, horizon=20.0, seeds=2, req_id="p1")
    rep = _ask(s, msg, (P.PreviewReply, P.Error))
    assert isinstance(rep, P.PreviewReply), rep
    assert rep.req_id == "p1" and rep.changes == change
    a = rep.assumptions
    assert a.horizon == 20.0 and a.seeds == [0, 1] and 0 < a.live_jobs <= len(ids)
    assert a.sampled_remaining == 0  # injected jobs ignore EOS: their lengths are known
    assert a.clock_samples > 0 and a.clock_scale > 0 and a.slo > 0
    for side in (rep.current, rep.proposed):
        assert side.finished.mean > 0 and math.isfinite(side.avg.mean)
        assert side.avg.lo <= side.avg.mean <= side.avg.hi
    assert rep.proposed.peak_kv_blocks.hi <= 48
    # nothing was applied: the settings and every job are as they were, and all finish
    after = _ask(s, P.Status(token=daemon.token), (P.StatusReply,))
    assert (after.policy, after.kv_policy) == (before.policy, before.kv_policy)
    assert after.preview_seconds > 0
    jobs = _ask(s, P.ListJobs(), (P.JobList,))
    assert {j.job_id for j in jobs.jobs} <= set(ids)
    while not set(ids) <= set(ENDS):
        _ask(s, None, (P.Finished,))
    assert {i: ENDS[i] for i in ids} == {i: ("length", 120) for i in ids}


@pytest.mark.parametrize(
    "change",
    [{"teleport": 1}, {"policy": "nope"}, {"max_batch_size": 0}, {"quanta": [0.1, -1.0]},
     {"profile": "other"}],
)  # fmt: skip
def test_bad_preview_input_gets_the_retunes_error(daemon: Daemon, change: dict) -> None:
    s = raw(daemon)
    retune = _ask(s, P.Retune(token=daemon.token, changes=change), (P.Error, P.Ack))
    assert isinstance(retune, P.Error) and retune.code == "invalid-setting"
    rep = _ask(s, P.Preview(token=daemon.token, changes=change, req_id="bad"), (P.Error,))
    assert (rep.code, rep.message, rep.req_id) == (retune.code, retune.message, "bad")


@pytest.mark.parametrize(
    ("fields", "words"),
    [({"horizon": 1e6}, "horizon"), ({"horizon": -1.0}, "horizon"),
     ({"horizon": math.nan}, "horizon"), ({"seeds": 0}, "seeds"), ({"seeds": 99}, "seeds"),
     ({"changes": {}}, "at least one")],
)  # fmt: skip
def test_a_bad_horizon_or_seed_count_is_an_invalid_setting(
    daemon: Daemon, fields: dict, words: str
) -> None:
    s = raw(daemon)
    msg = P.Preview(token=daemon.token, req_id="h", **{"changes": {"policy": "fcfs"}, **fields})
    rep = _ask(s, msg, (P.Error,))
    assert rep.code == "invalid-setting" and words in rep.message and rep.req_id == "h"


def test_a_client_may_not_preview_and_one_preview_runs_at_a_time(daemon: Daemon) -> None:
    s = raw(daemon)
    rep = _ask(s, P.Preview(changes={"policy": "fcfs"}, req_id="c"), (P.Error,))
    assert rep.code == "forbidden"
    _load(daemon, s, count=6)
    # seconds of runs (the worker is warm): the second request arrives within milliseconds
    long = P.Preview(token=daemon.token, changes={"policy": "fcfs"}, seeds=4, req_id="long")
    s.send(P.encode(long))
    second = P.Preview(token=daemon.token, changes={"policy": "fcfs"}, req_id="second")
    rep = _ask(s, second, (P.Error,))
    assert rep.code == "overloaded" and rep.req_id == "second"
    first = _ask(s, None, (P.PreviewReply, P.Error), timeout=600.0)
    assert isinstance(first, P.PreviewReply) and first.req_id == "long"
    status = _ask(s, P.Status(token=daemon.token), (P.StatusReply,))
    assert status.degraded is None


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_the_twin_worker_ends_with_a_daemon_that_is_killed_mid_preview(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, CONFIG)
    try:
        s = raw(d)
        before = set(_children(d.proc.pid))
        _load(d, s, count=6)
        # minutes of runs: the worker is busy when its daemon is killed
        s.send(P.encode(P.Preview(token=d.token, changes={"policy": "fcfs"}, horizon=600.0,
                                  seeds=16, req_id="k")))  # fmt: skip
        deadline = time.time() + 60
        workers: list[int] = []
        while not workers and time.time() < deadline:
            time.sleep(0.2)
            workers = [p for p in _children(d.proc.pid) if p not in before]
        assert workers, "the preview runs in a worker process"
        time.sleep(2.0)
    finally:
        d.proc.kill()
        d.proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and [p for p in workers if _alive(p)]:
        time.sleep(0.2)
    assert not [p for p in workers if _alive(p)], "a twin worker outlived its daemon"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
