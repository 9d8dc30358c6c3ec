"""Roles and caps against a real daemon: what a plain client may do, what needs the
operator, whose jobs a client may abort, job caps, drain/undrain, the token file."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import time

import pytest
import zmq

from fsd import protocol as P
from fsd.client import Client, RequestError
from fsd.credentials import token_path
from tests.server.daemon_proc import daemon_fixture, raw, start_daemon

CONFIG = """
[cache]
num_gpu_blocks = 64
num_host_blocks = 128
[sched]
max_batch_size = 8
[server]
telemetry_hz = 5
max_burst = 4
max_client_jobs = 6
"""

daemon = daemon_fixture(CONFIG, "access")


def replies(s: zmq.Socket, until: type, timeout: float = 20.0) -> list[P.Reply]:
    """Every reply up to and including the first of type `until`."""
    got: list[P.Reply] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        if s.poll(200):
            msg = P.decode_reply(s.recv())
            got.append(msg)
            if isinstance(msg, until):
                return got
    raise AssertionError(f"no {until.__name__} within {timeout} s; got {got}")


def test_a_plain_client_may_not_steer_the_daemon(daemon):
    with daemon.client(operator=False) as c:
        assert c.status().role == "client"
        refusals = {
            "retune": lambda: c.retune(policy="fcfs"),
            "inject": lambda: c.inject(burst=(1, 4, 2)),
            "drain": lambda: c.drain(timeout=1),
            "undrain": c.undrain,
            "shutdown": lambda: c.shutdown(drain=False),
        }
        for what, call in refusals.items():
            with pytest.raises(RequestError) as info:
                call()
            assert info.value.code == "forbidden", what
            assert f"{what} needs the operator role" in info.value.message
        # a wrong token is no token
        assert Client(daemon.endpoint, token="0" * 64).status().role == "client"
    with daemon.client() as op:
        assert op.status().role == "operator"
        assert op.status().policy == "fsd" and not op.status().draining  # nothing changed


def test_a_client_aborts_its_own_jobs_only_an_operator_anyones(daemon):
    with daemon.client(operator=False) as a, daemon.client(operator=False) as b:
        mine = a.submit([5] * 8, max_tokens=900, ignore_eos=True)
        theirs = b.submit([6] * 8, max_tokens=900, ignore_eos=True)
        with pytest.raises(RequestError) as info:
            b.abort(mine.job_id)
        assert info.value.code == "forbidden" and "not this client's" in info.value.message
        with pytest.raises(RequestError) as info:
            b.abort("job-none")
        assert info.value.code == "unknown-job"
        assert a.abort(mine.job_id)["job_id"] == mine.job_id
        assert mine.result(timeout=20).finish_reason == "abort"
        with daemon.client() as op:
            op.abort(theirs.job_id)
        done = theirs.result(timeout=20)
        assert done.finish_reason == "abort" and len(done.token_ids) < 900


def test_drain_for_a_while_then_undrain(daemon):
    with daemon.client() as op:
        assert op.drain(timeout=5)["drained"] is True
        with pytest.raises(RequestError) as info:
            op.complete([1, 2], max_tokens=2)
        assert info.value.code == "draining"
        assert op.status().draining
        op.undrain()
        assert not op.status().draining
        assert len(op.complete([1, 2], max_tokens=2, ignore_eos=True).token_ids) == 2


def test_job_caps_per_message_and_per_connection(daemon):
    with daemon.client() as op:
        with pytest.raises(RequestError) as info:
            op.inject(burst=(5, 4, 2))
        assert info.value.code == "invalid" and "max_burst" in info.value.message
        handles = [op.submit([7] * 4, max_tokens=400, ignore_eos=True) for _ in range(6)]
        for h in handles:
            h.accepted(timeout=20)
        with pytest.raises(RequestError) as info:
            op.complete([7] * 4, max_tokens=2)
        assert info.value.code == "overloaded" and "max_client_jobs" in info.value.message
        with pytest.raises(RequestError) as info:
            op.inject(burst=(1, 4, 2))
        assert info.value.code == "overloaded"
        # another connection has room of its own
        with daemon.client(operator=False) as other:
            assert len(other.complete([3, 4], max_tokens=2, ignore_eos=True).token_ids) == 2
        for h in handles:
            h.abort()


def test_a_duplicate_req_id_is_refused_and_the_live_job_streams_on(daemon):
    s = raw(daemon)
    try:
        submit = P.Submit(
            req_id="same",
            prompt_token_ids=[9] * 6,
            sampling=P.Sampling(max_tokens=40, ignore_eos=True),
        )
        s.send(P.encode(submit))
        first = replies(s, P.Accepted)[-1]
        s.send(P.encode(submit))
        got = replies(s, P.Finished, timeout=60)
        errors = [m for m in got if isinstance(m, P.Error)]
        assert [e.code for e in errors] == ["duplicate-req-id"]
        fin = got[-1]
        assert fin.req_id == "same" and fin.job_id == first.job_id
        assert fin.reason == "length" and len(fin.token_ids) == 40
    finally:
        s.close()


def test_the_operator_token_file_is_private_and_goes_with_the_daemon(tmp_path):
    d = start_daemon(tmp_path)
    path = token_path(d.state_dir, d.endpoint)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == 0o600, oct(mode)
        assert stat.S_IMODE(d.state_dir.stat().st_mode) & 0o077 == 0
        assert len(path.read_text().strip()) == 64
        # fsctl finds it through --state-dir (or FSD_STATE_DIR) and gets the operator role
        env = {**os.environ, "FSD_STATE_DIR": str(d.state_dir)}
        cmd = [sys.executable, "-m", "fsd.console.cli", "--endpoint", d.endpoint]
        ok = subprocess.run(
            [*cmd, "retune", "policy=fcfs"], capture_output=True, text=True, env=env
        )
        assert ok.returncode == 0, ok.stderr
        env["FSD_STATE_DIR"] = str(tmp_path / "elsewhere")
        no = subprocess.run(
            [*cmd, "retune", "policy=mlfq"], capture_output=True, text=True, env=env
        )
        assert no.returncode == 2 and "retune needs the operator role" in no.stderr
    finally:
        assert d.stop() == 0
    assert not path.exists()


def test_the_daemon_wide_job_cap_refuses_every_session_clearly(tmp_path):
    # max_client_jobs bounds one session; max_jobs bounds them all: a third client
    # past it hears "overloaded" naming the cap, and serves again once jobs end
    d = start_daemon(tmp_path, CONFIG + "max_jobs = 8\n")
    try:
        with d.client() as a, d.client(operator=False) as b:
            held = [a.submit([7] * 4, max_tokens=400, ignore_eos=True) for _ in range(6)]
            held += [b.submit([8] * 4, max_tokens=400, ignore_eos=True) for _ in range(2)]
            for h in held:
                h.accepted(timeout=20)
            with d.client(operator=False) as c:
                with pytest.raises(RequestError) as info:
                    c.complete([3, 4], max_tokens=2)
                assert info.value.code == "overloaded"
                assert "max_jobs is 8" in info.value.message
                held[0].abort()
                held[0].result(timeout=20)
                assert len(c.complete([3, 4], max_tokens=2, ignore_eos=True).token_ids) == 2
            for h in held[1:]:
                h.abort()
        assert d.proc.poll() is None
    finally:
        assert d.stop() == 0


def test_a_client_filling_the_kv_does_not_hold_back_anothers_short_job(daemon):
    # six long jobs need more KV than the device pool holds; once they swap, a short job
    # from another client still ends before any of them (under FCFS it would wait)
    with daemon.client() as hog, daemon.client(operator=False) as other:
        long_jobs = [hog.submit([9] * 4, max_tokens=800, ignore_eos=True) for _ in range(6)]
        for h in long_jobs:
            h.accepted(timeout=20)
        deadline = time.time() + 120
        while daemon.snapshot().kv.host_used == 0:  # the device pool is full: they swap
            assert time.time() < deadline, "the long jobs never filled the device pool"
        short = other.complete([3, 4], max_tokens=4, ignore_eos=True)
        assert len(short.token_ids) == 4
        assert not [h for h in long_jobs if h.done]
        for h in long_jobs:
            if not h.done:  # (one may have ended since: nothing to abort)
                with contextlib.suppress(RequestError):
                    h.abort()
