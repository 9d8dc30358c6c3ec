"""The client SDK against a fake daemon: routing, errors, timeouts, reconnects, heartbeats."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import zmq
import zmq.auth

from fsd import protocol as P
from fsd.client import (
    AsyncClient,
    Client,
    CurveKeys,
    DaemonUnavailable,
    RequestError,
)
from fsd.errors import ConfigError, FsdError
from tests.client.fake_daemon import FakeDaemon, free_port


def wait_until(pred, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_complete_returns_the_whole_result(fake):
    with Client(fake.endpoint, timeout=2) as c:
        out = c.complete("abc", max_tokens=5)
    assert out.text == "abcab"
    assert out.token_ids == [ord(ch) for ch in "abcab"]
    assert out.finish_reason == "length"
    assert out.prompt_tokens == 3
    assert out.job_id.startswith("job-")
    assert out.ttft is not None and out.latency >= out.ttft >= 0
    assert out.per_token_latency == pytest.approx(out.latency / 5)
    assert out.counts == {"preemptions": 1, "swaps_out": 0, "swaps_in": 0, "recomputes": 0}
    submit = fake.requests(P.Submit)[0]
    assert submit.sampling.max_tokens == 5 and submit.prompt == "abc"


def test_generate_streams_chunks_and_prompt_token_ids_work(fake):
    with Client(fake.endpoint, timeout=2) as c:
        handle = c.generate("xy", max_tokens=5)
        chunks = list(handle)
        by_ids = c.complete([104, 105], max_tokens=3)
    assert "".join(ch.text for ch in chunks) == "xyxyx"
    assert {ch.job_id for ch in chunks} == {handle.job_id}
    assert handle.result().text == "xyxyx" and handle.done
    assert by_ids.text == "hih"
    assert fake.requests(P.Submit)[1].prompt_token_ids == [104, 105]


def test_two_streams_and_control_replies_interleave_on_one_socket(fake):
    # Held jobs advance one iteration right before each control reply, so each reply
    # arrives just behind a Tokens message carrying chunks of both jobs.
    fake.hold, fake.chatter = True, True
    with Client(fake.endpoint, timeout=2) as c:
        a = c.submit("ab", max_tokens=4, tags=["a"])
        b = c.submit("xyz", max_tokens=4)
        assert a.job_id != b.job_id
        assert c.status().jobs == 2
        assert sorted(j.job_id for j in c.jobs()) == sorted([a.job_id, b.job_id])
        assert c.job(a.job_id).tags == ["a"]
        stream = iter(a)
        assert [next(stream).text for _ in range(3)] == ["a", "b", "a"]
        fake.hold = False
        assert "".join(ch.text for ch in stream) == "b"
        assert b.result().text == "xyzx"
        assert a.result().text == "abab"


def test_error_replies_raise_request_error(fake):
    with Client(fake.endpoint, timeout=2) as c:
        with pytest.raises(RequestError) as err:
            c.job("job-99")
        assert err.value.code == "unknown-job"
        handle = c.submit("z" * 200)
        with pytest.raises(RequestError, match="exceeds 100") as err:
            handle.result()
        assert err.value.code == "prompt-too-long" and err.value.req_id == handle.req_id
        with pytest.raises(RequestError, match="invalid-setting"):
            c.retune(bogus=1)
        assert c.status().pid == 1234  # still in step after the errors


def test_sampling_is_validated_before_sending(fake):
    with Client(fake.endpoint, timeout=2) as c:
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
    assert fake.requests(P.Submit) == []


def test_nothing_listening_is_daemon_unavailable():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with Client(endpoint, timeout=0.3) as c:
        start = time.monotonic()
        with pytest.raises(DaemonUnavailable) as err:
            c.status()
        assert str(err.value) == f"no fsd daemon answered at {endpoint} within 0.3 s"
        assert isinstance(err.value, TimeoutError)
        with pytest.raises(DaemonUnavailable):
            c.complete("hi")
    assert time.monotonic() - start < 3


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
            assert c.status().policy == "skip-join"
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
        fake.config["policy"] = "fcfs"
        assert c.status().policy == "fcfs"


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


def test_abort_finishes_the_job_with_reason_abort(fake):
    fake.hold = True
    with Client(fake.endpoint, timeout=2) as c:
        handle = c.submit("abc", max_tokens=8)
        assert c.abort(handle.job_id) == {"job_id": handle.job_id}
        assert handle.result().finish_reason == "abort"
        with pytest.raises(RequestError, match="unknown-job"):
            c.abort("job-404")


def test_control_calls(fake):
    fake.hold = True
    with Client(fake.endpoint, timeout=2) as c:
        ids = c.inject(burst=(3, 4, 5), tag="burst")
        assert len(ids) == 3
        assert {j.job_id for j in c.jobs()} == set(ids)
        assert c.job(ids[0]).tags == ["burst"]
        assert c.retune(quanta=[0.5, 1.0])["quanta"] == [0.5, 1.0]
        with pytest.raises(ConfigError):
            c.inject()
        assert c.drain(timeout=1)["jobs"] == 3
        with pytest.raises(RequestError, match="draining"):
            c.complete("x")
        assert c.shutdown() == {}
    inject = fake.requests(P.Inject)[0]
    assert inject.burst == P.Burst(count=3, input_len=4, output_len=5) and inject.tag == "burst"


def test_closing_aborts_streaming_jobs(fake):
    fake.hold = True
    c = Client(fake.endpoint, timeout=2)
    handle = c.submit("abc", max_tokens=8)
    job_id = handle.job_id
    c.close()
    wait_until(lambda: [a.job_id for a in fake.requests(P.Abort)] == [job_id])
    with pytest.raises(FsdError, match="closed"):
        handle.result()
    with pytest.raises(FsdError, match="closed"):
        c.status()


def test_threads_may_share_one_client(fake):
    results: list[str] = []
    with Client(fake.endpoint, timeout=2) as c:

        def work(prompt: str) -> None:
            for _ in range(3):
                results.append(c.complete(prompt, max_tokens=4).text)
                c.status()

        threads = [threading.Thread(target=work, args=(p,)) for p in ("ab", "cd", "ef", "gh")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert sorted(results) == sorted(["abab", "cdcd", "efef", "ghgh"] * 3)


def test_curve_keys_from_files_and_z85(tmp_path):
    server_pub, server_sec = zmq.auth.create_certificates(str(tmp_path), "server")
    client_pub, client_sec = zmq.auth.create_certificates(str(tmp_path), "client")
    spub, ssec = zmq.auth.load_certificate(server_sec)
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

    daemon = FakeDaemon(curve=(spub, ssec)).start()
    try:
        with Client(daemon.endpoint, timeout=2, curve=CurveKeys(server_pub, None, client_sec)) as c:
            assert c.complete("ab", max_tokens=2).text == "ab"
        with Client(daemon.endpoint, timeout=0.3) as plain, pytest.raises(DaemonUnavailable):
            plain.status()
    finally:
        daemon.stop()


# ---- asyncio ----------------------------------------------------------------------


def test_async_client_streams_completes_and_controls(fake):
    async def main() -> None:
        async with AsyncClient(fake.endpoint, timeout=2) as c:
            texts = [ch.text async for ch in c.generate("xy", max_tokens=3)]
            assert texts == ["x", "y", "x"]
            out = await c.complete([104, 105], max_tokens=3)
            assert out.text == "hih" and out.finish_reason == "length"
            fake.hold, fake.chatter = True, True
            a = await c.submit("ab", max_tokens=4)
            b = await c.submit("xyz", max_tokens=4)
            assert (await a.accepted()) != (await b.accepted())
            assert (await c.status()).jobs == 2
            assert len(await c.jobs()) == 2
            assert (await c.job(b.job_id)).job_id == b.job_id
            fake.hold = False
            results = await asyncio.gather(a.result(), b.result())
            assert [r.text for r in results] == ["abab", "xyzx"]
            with pytest.raises(RequestError, match="unknown-job"):
                await c.job("job-404")
            with pytest.raises(RequestError, match="prompt-too-long"):
                await c.complete("z" * 200)
            assert (await c.retune(policy="fcfs"))["policy"] == "fcfs"
            assert len(await c.inject(burst=(2, 3, 4))) == 2
            assert "jobs" in await c.drain(timeout=1)

    asyncio.run(main())


def test_async_abort_and_heartbeat(fake):
    async def main() -> None:
        fake.hold = True
        async with AsyncClient(fake.endpoint, timeout=2, heartbeat=0.05) as c:
            handle = await c.submit("abc", max_tokens=8)
            await handle.accepted()
            deadline = time.monotonic() + 3
            while len(fake.requests(P.Ping)) < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await handle.abort()
            assert (await handle.result()).finish_reason == "abort"

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


def test_a_duplicate_req_id_refusal_leaves_the_live_stream_alone():
    import queue

    from fsd.client_core import ClientCore

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


def test_a_request_over_the_frame_limit_is_refused_before_it_is_sent(fake):
    with Client(fake.endpoint, timeout=2) as c:
        with pytest.raises(ConfigError, match="frame limit"):
            c.submit("x" * (P.MAX_FRAME_BYTES + 1), max_tokens=1)
        assert c.complete("ab", max_tokens=2).text == "ab"
    assert len(fake.requests(P.Submit)) == 1
