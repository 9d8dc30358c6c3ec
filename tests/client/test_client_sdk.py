"""The client SDK: happy paths against a real daemon (one per module), timing faults
against the fake one, local validation with no daemon, and the socket-free core."""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
import time

import pytest
import zmq
import zmq.auth

from fsd import protocol as P
from fsd.client import (
    AsyncClient,
    Client,
    ClientCore,
    CurveKeys,
    DaemonUnavailable,
    RequestError,
    TelemetryClient,
)
from fsd.errors import ConfigError, FsdError
from tests.client.fake_daemon import FakeDaemon, free_port

LONG = 2000  # output tokens of a job that is still running when the test acts on it


def wait_until(pred, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


# ---- the real daemon ----------------------------------------------------------------


def test_complete_returns_the_whole_result(daemon):
    with daemon.client() as c:
        out = c.complete("abc", max_tokens=5, ignore_eos=True)
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    assert out.prompt_tokens == 3 and out.job_id.startswith("job-")
    assert out.ttft is not None and out.latency >= out.ttft >= 0
    assert out.per_token_latency == pytest.approx(out.latency / 5)
    assert set(out.counts) == {"preemptions", "swaps_out", "swaps_in", "recomputes"}


def test_generate_streams_chunks_and_prompt_token_ids_work(daemon):
    with daemon.client() as c:
        handle = c.generate("xy", max_tokens=6, ignore_eos=True)
        chunks = list(handle)
        done = handle.result()
        by_ids = c.complete([104, 105], max_tokens=3, ignore_eos=True)
    assert [t for ch in chunks for t in ch.token_ids] == done.token_ids
    assert "".join(ch.text for ch in chunks) == done.text and len(done.token_ids) == 6
    assert {ch.job_id for ch in chunks} == {handle.job_id} and handle.done
    assert by_ids.prompt_tokens == 2 and len(by_ids.token_ids) == 3


def test_two_streams_and_control_replies_interleave_on_one_socket(daemon):
    with daemon.client() as c:
        a = c.submit([1, 2], max_tokens=LONG, ignore_eos=True, tags=["a"])
        b = c.submit([3, 4, 5], max_tokens=LONG, ignore_eos=True)
        assert a.job_id != b.job_id
        stream = iter(a)
        head = [next(stream) for _ in range(3)]
        # control replies arrive among both jobs' Tokens messages
        assert c.status().jobs >= 2
        assert {a.job_id, b.job_id} <= {j.job_id for j in c.jobs()}
        assert c.job(a.job_id).tags == ["a"]
        assert c.abort(a.job_id)["job_id"] == a.job_id
        b.abort()
        tail = list(stream)
        done = a.result()
        assert done.finish_reason == "abort" and b.result().finish_reason == "abort"
        assert [t for ch in head + tail for t in ch.token_ids] == done.token_ids


def test_error_replies_raise_request_error_with_the_daemons_code(daemon):
    with daemon.client() as c:
        with pytest.raises(RequestError) as err:
            c.job("job-none")
        assert err.value.code == "unknown-job"
        handle = c.submit([1] * 5000)
        with pytest.raises(RequestError, match="context") as err:
            handle.result()
        assert err.value.code == "prompt-too-long" and err.value.req_id == handle.req_id
        with pytest.raises(RequestError) as err:
            c.retune(bogus=1)
        assert err.value.code == "invalid-setting" and "bogus" in err.value.message
        with pytest.raises(RequestError) as err:
            c.retune(quanta=[2.0, 1.0])
        assert err.value.code == "invalid-setting"
        with pytest.raises(RequestError, match="unknown-job"):
            c.abort("job-404")
        assert c.status().pid == daemon.proc.pid  # still in step after the errors


def test_control_calls(daemon):
    with daemon.client() as c:
        ids = c.inject(burst=(3, 4, LONG), tag="burst")
        assert len(ids) == 3
        assert set(ids) <= {j.job_id for j in c.jobs()}
        assert c.job(ids[0]).tags == ["burst"]
        for job_id in ids:
            c.abort(job_id)
        assert {f.reason for f in c.wait_injected(ids, timeout=30).values()} == {"abort"}
        assert c.retune(quanta=[0.5, 1.0])["sched"]["quanta"] == [0.5, 1.0]
        assert c.retune(quanta=None)["sched"]["quanta"] is None
        with pytest.raises(ConfigError):
            c.inject()
        try:
            assert c.drain(timeout=10)["drained"] is True
            with pytest.raises(RequestError, match="draining"):
                c.complete("x")
        finally:
            assert c.undrain() == {"draining": False}
        assert len(c.complete("x", max_tokens=2, ignore_eos=True).token_ids) == 2


def test_closing_aborts_streaming_jobs(daemon):
    with TelemetryClient(daemon.telemetry, snapshots=False) as events:
        c = daemon.client()
        handle = c.submit([1, 2, 3], max_tokens=LONG, ignore_eos=True)
        job_id = handle.job_id
        c.close()
        with pytest.raises(FsdError, match="closed"):
            handle.result()
        with pytest.raises(FsdError, match="closed"):
            c.status()
        # the daemon aborts it at once (it would reap a silent client's job only after
        # its 30 s client_timeout)
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "the job was not aborted"
            msg = events.recv(timeout=1)
            if isinstance(msg, P.Event) and msg.kind == "abort" and msg.job_id == job_id:
                break


def test_threads_may_share_one_client(daemon):
    results: list[tuple[int, int]] = []
    with daemon.client() as c:

        def work(first: int) -> None:
            for _ in range(3):
                out = c.complete([first, 7], max_tokens=4, ignore_eos=True)
                results.append((out.prompt_tokens, len(out.token_ids)))
                c.status()

        threads = [threading.Thread(target=work, args=(p,)) for p in (11, 12, 13, 14)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert results == [(2, 4)] * 12


def test_a_request_over_the_frame_limit_is_refused_before_it_is_sent(daemon):
    with daemon.client() as c:
        with pytest.raises(ConfigError, match="frame limit"):
            c.submit("x" * (P.MAX_FRAME_BYTES + 1), max_tokens=1)
        assert len(c.complete("ab", max_tokens=2, ignore_eos=True).token_ids) == 2


def test_async_client_streams_completes_and_controls(daemon):
    async def main() -> None:
        async with AsyncClient(daemon.endpoint, timeout=10, token=daemon.token) as c:
            chunks = [ch async for ch in c.generate("xy", max_tokens=3, ignore_eos=True)]
            assert sum(len(ch.token_ids) for ch in chunks) == 3
            out = await c.complete([104, 105], max_tokens=3, ignore_eos=True)
            assert out.finish_reason == "length" and out.prompt_tokens == 2
            a = await c.submit([1, 2], max_tokens=LONG, ignore_eos=True)
            b = await c.submit([3, 4, 5], max_tokens=LONG, ignore_eos=True)
            assert (await a.accepted()) != (await b.accepted())
            assert (await c.status()).jobs >= 2
            assert {a.job_id, b.job_id} <= {j.job_id for j in await c.jobs()}
            assert (await c.job(b.job_id)).job_id == b.job_id
            await a.abort()
            await b.abort()
            results = await asyncio.gather(a.result(), b.result())
            assert [r.finish_reason for r in results] == ["abort", "abort"]
            with pytest.raises(RequestError, match="unknown-job"):
                await c.job("job-404")
            with pytest.raises(RequestError, match="prompt-too-long"):
                await c.complete([1] * 5000)
            assert (await c.retune(policy="fcfs"))["sched"]["policy"] == "fcfs"
            assert (await c.retune(policy="default"))["sched"]["policy"] == "default"
            assert len(await c.inject(burst=(2, 3, 4))) == 2
            try:
                assert "drained" in await c.drain(timeout=10)
            finally:
                assert await c.undrain() == {"draining": False}

    asyncio.run(main())


# ---- no daemon: checked before anything is sent ----------------------------------------


def test_sampling_is_validated_before_sending():
    # nothing listens: each refusal comes from the client itself, at once
    with Client(f"tcp://127.0.0.1:{free_port()}", timeout=0.3) as c:
        with pytest.raises(ConfigError, match="top_p"):
            c.submit("x", top_p=0)
        with pytest.raises(ConfigError, match="unknown sampling option 'temp'"):
            c.submit("x", temp=1.0)
        with pytest.raises(ConfigError, match="token ids"):
            c.submit([])
        for bad in (float("nan"), float("inf")):  # used to reach the daemon and kill it
            with pytest.raises(ConfigError, match="temperature"):
                c.submit("x", temperature=bad)
        with pytest.raises(ConfigError, match="temperature"):
            c.submit("x", temperature=float("inf"), min_tokens=1)


def test_nothing_listening_is_daemon_unavailable():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with Client(endpoint, timeout=0.3) as c:
        start = time.monotonic()
        with pytest.raises(DaemonUnavailable) as err:
            c.status()
        assert str(err.value) == f"no fsd daemon answered at {endpoint} within 0.3 s"
        assert isinstance(err.value, TimeoutError) and err.value.code == "unavailable"
        with pytest.raises(DaemonUnavailable):
            c.complete("hi")
    assert time.monotonic() - start < 3


def test_curve_keys_from_files_and_z85(tmp_path):
    # a CURVE daemon serving these keys: tests/server/test_daemon_life.py
    server_pub, server_sec = zmq.auth.create_certificates(str(tmp_path), "server")
    client_pub, client_sec = zmq.auth.create_certificates(str(tmp_path), "client")
    spub, _ = zmq.auth.load_certificate(server_sec)
    cpub, csec = zmq.auth.load_certificate(client_sec)
    with pytest.raises(ConfigError, match="readable by others"):  # pyzmq writes it 0644
        CurveKeys(server_pub, None, client_sec).resolve()
    os.chmod(client_sec, 0o600)
    assert CurveKeys(server_pub, None, client_sec).resolve() == (spub, cpub, csec)
    assert CurveKeys(spub.decode(), cpub.decode(), csec.decode()).resolve() == (spub, cpub, csec)
    with pytest.raises(ConfigError, match="holds no secret key"):
        CurveKeys(server_pub, None, client_pub).resolve()
    with pytest.raises(ConfigError, match="does not exist"):
        CurveKeys(tmp_path / "missing.key", None, client_sec).resolve()


def test_the_sdk_loads_without_the_serving_stack():
    # fsctl and client programs import fsd.client: no engine, scheduler, KV or server code
    code = (
        "import sys, fsd.client\n"
        "banned = ('fsd.config', 'fsd.engine', 'fsd.sched', 'fsd.kv', 'fsd.server', 'torch')\n"
        "print(sorted(m for m in sys.modules if m.startswith(banned)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_sdk_defaults_are_the_daemons():
    from fsd.client import DEFAULT_ENDPOINT, DEFAULT_TELEMETRY_ENDPOINT
    from fsd.client.base import DEFAULT_TIMEOUT
    from fsd.config import ServerConfig

    daemon = ServerConfig()
    assert (daemon.endpoint, daemon.telemetry_endpoint, daemon.client_timeout) == (
        DEFAULT_ENDPOINT,
        DEFAULT_TELEMETRY_ENDPOINT,
        DEFAULT_TIMEOUT,
    )


# ---- timing faults: the fake daemon ---------------------------------------------------


def test_reconnects_after_the_daemon_restarts():
    first = FakeDaemon().start()
    with Client(first.endpoint, timeout=0.3) as c:
        assert c.complete("ab", max_tokens=2).text == "ab"
        first.hold = True
        handle = c.submit("ab", max_tokens=2)
        handle.accepted()
        first.stop()  # the daemon dies with a job in flight: the silence probe notices
        with pytest.raises(DaemonUnavailable):
            handle.result(timeout=5)
        second = FakeDaemon(port=first.port).start()
        try:
            assert c.status().iterations == 1  # the new daemon's first Status
            assert c.complete("cd", max_tokens=3).text == "cdc"
        finally:
            second.stop()


def test_a_late_reply_never_answers_a_later_call(fake):
    # After a timeout the client takes a fresh socket, so the first (stale) status
    # reply cannot be taken for the answer to the second call.
    # t=0: status #1, answered at 0.8; t=0.5: timeout, status #2 answered at >= 0.85.
    fake.reply_delay = 0.8
    with Client(fake.endpoint, timeout=0.5) as c:
        with pytest.raises(DaemonUnavailable):
            c.status()
        fake.reply_delay = 0.35
        assert c.status().iterations == 2  # the fake counts the Status requests it answers


def test_heartbeat_pings_only_while_jobs_are_outstanding(fake):
    fake.hold = True
    with Client(fake.endpoint, timeout=2, heartbeat=0.05) as c:
        handle = c.submit("ab", max_tokens=2)
        handle.accepted()
        wait_until(lambda: len(fake.requests(P.Ping)) >= 3)
        fake.hold = False
        handle.result()
        pings = len(fake.requests(P.Ping))
        time.sleep(0.25)
        assert len(fake.requests(P.Ping)) <= pings + 1  # one may have been in flight


def test_async_heartbeat(fake):
    async def main() -> None:
        fake.hold = True
        async with AsyncClient(fake.endpoint, timeout=2, heartbeat=0.05) as c:
            handle = await c.submit("abc", max_tokens=8)
            await handle.accepted()
            deadline = time.monotonic() + 3
            while len(fake.requests(P.Ping)) < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            fake.hold = False
            assert (await handle.result()).text == "abcabcab"

    asyncio.run(main())


def test_async_unavailable_then_reconnect():
    port = free_port()

    async def main() -> None:
        async with AsyncClient(f"tcp://127.0.0.1:{port}", timeout=0.3) as c:
            with pytest.raises(DaemonUnavailable, match="within 0.3 s"):
                await c.status()
            with pytest.raises(DaemonUnavailable):
                await c.complete("ab")
            daemon = FakeDaemon(port=port).start()
            try:
                assert (await c.complete("ab", max_tokens=3)).text == "aba"
            finally:
                daemon.stop()

    asyncio.run(main())


# ---- the socket-free core ---------------------------------------------------------------


def test_tokens_and_control_replies_interleaved_each_reach_their_own():
    core = ClientCore("tcp://x", timeout=5.0, heartbeat=1.0)
    sink_a: queue.Queue = queue.Queue()
    sink_b: queue.Queue = queue.Queue()
    core.add_stream("ra", sink_a, now=0.0)
    core.add_stream("rb", sink_b, now=0.0)
    status: queue.Queue = queue.Queue()
    jobs: queue.Queue = queue.Queue()

    class Fut:  # the part of a future the core uses
        def __init__(self, q: queue.Queue) -> None:
            self.q = q

        def done(self) -> bool:
            return False

        def set_result(self, value) -> None:
            self.q.put(value)

    core.add_call("status", Fut(status), now=0.0)
    core.add_call("jobs", Fut(jobs), now=0.0)
    chunk = lambda r, j, t: P.Chunk(req_id=r, job_id=j, token_ids=[t])  # noqa: E731
    core.route(P.Accepted(req_id="ra", job_id="job-1", prompt_tokens=2))
    core.route(P.Tokens(chunks=[chunk("ra", "job-1", 1), chunk("rb", "job-2", 2)]))
    core.route(P.JobList(jobs=[]))  # the second call's answer may come first
    core.route(P.Tokens(chunks=[chunk("rb", "job-2", 3)]))
    core.route(P.StatusReply(pid=1, version="x", model="m", policy="p", kv_policy="k",
                             uptime=0.0, jobs=2, running=2, iterations=1, draining=False))  # fmt: skip
    assert jobs.get_nowait().jobs == [] and status.get_nowait().jobs == 2
    assert core.calls == []
    got_a = [sink_a.get_nowait() for _ in range(sink_a.qsize())]
    got_b = [sink_b.get_nowait() for _ in range(sink_b.qsize())]
    assert [type(m).__name__ for m in got_a] == ["Accepted", "Chunk"]
    assert [m.token_ids for m in got_b] == [[2], [3]]


def test_a_duplicate_req_id_refusal_leaves_the_live_stream_alone():
    core = ClientCore("tcp://x", timeout=5.0, heartbeat=1.0)
    sink: queue.Queue = queue.Queue()
    core.add_stream("r1", sink, now=0.0)
    core.route(P.Accepted(req_id="r1", job_id="job-1", prompt_tokens=2))
    core.route(P.Error(code="duplicate-req-id", message="already in flight", req_id="r1"))
    fin = P.Finished(req_id="r1", job_id="job-1", reason="length", text="ab", token_ids=[1, 2],
                     timings=P.Timings(arrival=0.0))  # fmt: skip
    core.route(fin)
    got = [sink.get_nowait() for _ in range(sink.qsize())]
    assert [type(m).__name__ for m in got] == ["Accepted", "Finished"]
    assert "r1" not in core.streams
