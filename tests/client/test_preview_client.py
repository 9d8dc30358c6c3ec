"""`Client.preview` / `AsyncClient.preview` against the fake daemon: the reply by req_id,
the daemon's refusals as `RequestError`s with their codes, and the routing in the core."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

import pytest

from fsd import protocol as P
from fsd.client import AsyncClient, Client, ClientCore, RequestError
from fsd.client.core import answered_by_id
from fsd.errors import ConfigError, FsdError
from tests.client.fake_daemon import preview_reply, running


def wait_until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the fake daemon did not get there in time"
        time.sleep(0.01)


def test_preview_returns_the_reply_named_by_its_request():
    with running() as fake, Client(fake.endpoint, timeout=5) as c:
        reply = c.preview(horizon=30.0, seeds=2, policy="fcfs", q1=0.005)
        (sent,) = fake.requests(P.Preview)
    assert isinstance(reply, P.PreviewReply)
    assert sent.changes == {"policy": "fcfs", "q1": 0.005}
    assert (sent.horizon, sent.seeds) == (30.0, 2) and sent.req_id
    assert reply.req_id == sent.req_id and reply.changes == sent.changes
    assert reply.assumptions.horizon == 30.0 and reply.assumptions.seeds == [0, 1]
    assert reply.proposed.p95.mean < reply.current.p95.mean


def test_preview_defaults_and_an_empty_change_is_refused_here():
    with running() as fake, Client(fake.endpoint, timeout=5) as c:
        c.preview(policy="fcfs")
        with pytest.raises(ConfigError, match="preview needs at least one setting"):
            c.preview()
        with pytest.raises(ConfigError, match="at least one setting"):
            c.preview(horizon=10.0)
        (sent,) = fake.requests(P.Preview)  # the refused ones never left
    assert (sent.horizon, sent.seeds) == (60.0, 4)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"bogus": 1}, "unknown setting bogus"),
        ({"policy": "fcfs", "seeds": 0}, "seeds"),
        ({"policy": "fcfs", "horizon": 1e6}, "horizon"),
    ],
)
def test_a_refused_preview_raises_its_code_and_req_id(kwargs, words):
    with running() as fake, Client(fake.endpoint, timeout=5) as c:
        with pytest.raises(RequestError, match=words) as info:
            c.preview(**kwargs)
        (sent,) = fake.requests(P.Preview)
        assert c.status().jobs == 0  # the connection goes on
    assert isinstance(info.value, FsdError)
    assert info.value.code == "invalid-setting" and info.value.req_id == sent.req_id


def test_preview_needs_the_operator_role():
    with running(token="s3cret") as fake:
        with Client(fake.endpoint, timeout=5) as c, pytest.raises(RequestError) as info:
            c.preview(policy="fcfs")
        assert info.value.code == "forbidden"
        with Client(fake.endpoint, timeout=5, token="s3cret") as c:
            assert c.preview(policy="fcfs").req_id is not None


def test_a_second_preview_while_one_runs_is_overloaded_and_other_calls_go_on():
    with running() as fake, Client(fake.endpoint, timeout=5) as c:
        fake.hold_previews = True
        first: Future[P.PreviewReply] = Future()

        def ask() -> None:
            try:
                first.set_result(c.preview(policy="fcfs"))
            except BaseException as exc:  # handed to the test thread
                first.set_exception(exc)

        threading.Thread(target=ask, daemon=True).start()
        wait_until(lambda: fake.previews)
        with pytest.raises(RequestError) as info:
            c.preview(policy="srpt")
        assert info.value.code == "overloaded"
        assert c.status().role == "operator"  # a StatusReply is not taken for the preview
        assert not first.done()
        fake.hold_previews = False
        reply = first.result(timeout=10)
    assert reply.changes == {"policy": "fcfs"}
    assert reply.req_id == fake.requests(P.Preview)[0].req_id


def test_async_preview_reply_and_refusals():
    async def main(endpoint: str, fake) -> None:
        async with AsyncClient(endpoint, timeout=5) as c:
            reply = await c.preview(seeds=3, kv_policy="reactive")
            assert reply.changes == {"kv_policy": "reactive"}
            assert reply.assumptions.seeds == [0, 1, 2]
            with pytest.raises(ConfigError):
                await c.preview()
            with pytest.raises(RequestError) as info:
                await c.preview(bogus=True)
            assert info.value.code == "invalid-setting"
            fake.hold_previews = True
            pending = asyncio.ensure_future(c.preview(policy="fcfs"))
            deadline = time.monotonic() + 10
            while not fake.previews and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            with pytest.raises(RequestError) as info:
                await c.preview(policy="srpt")
            assert info.value.code == "overloaded"
            fake.hold_previews = False
            assert (await pending).changes == {"policy": "fcfs"}

    with running() as fake:
        asyncio.run(main(fake.endpoint, fake))


def test_the_core_routes_a_preview_answer_by_id_only():
    core = ClientCore("tcp://x", timeout=5.0, heartbeat=1.0)
    msg = P.Preview(changes={"policy": "fcfs"}, req_id="r-1")
    assert answered_by_id(msg) == "r-1"
    status, preview, other = Future(), Future(), Future()
    core.add_call("preview", preview, 0.0, 300.0, req_id="r-1")
    core.add_call("status", status, 0.0)
    core.add_call("preview", other, 0.0, 300.0, req_id="r-2")
    # an id-less Error goes to the call not answered by id
    core.route(P.Error(code="internal", message="boom"))
    assert isinstance(status.result(0), P.Error) and not preview.done()
    core.route(preview_reply({"policy": "fcfs"}, req_id="r-2"))
    assert other.result(0).req_id == "r-2" and not preview.done()
    core.route(P.Error(code="overloaded", message="busy", req_id="r-1"))
    assert preview.result(0).code == "overloaded" and not core.calls
    core.route(preview_reply({"policy": "fcfs"}, req_id="r-9"))  # nobody's: dropped
