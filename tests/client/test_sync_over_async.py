"""The sync `Client` as a thin layer over the `AsyncClient`: the same surface, the same
streams and results, shared by threads, and the handles' waits, timeouts and close."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import pytest

from fsd import protocol as P
from fsd.client import AsyncClient, Client, Completion
from fsd.errors import FsdError

PROMPTS = ["ab", "xyz", "q", "hello", "fsd"]


def _shape(chunks: list[P.Chunk], done: Completion) -> tuple:
    """What a job's stream and result say, less the ids and clocks of this run."""
    texts = [c.text for c in chunks]
    ids = [list(c.token_ids) for c in chunks]
    return texts, ids, done.text, done.token_ids, done.finish_reason, done.prompt_tokens


def test_every_async_method_has_its_sync_twin_with_the_same_parameters():
    for name, amethod in inspect.getmembers(AsyncClient, inspect.iscoroutinefunction):
        if name.startswith("_") or name == "close":
            continue
        sync = inspect.signature(getattr(Client, name))
        assert list(sync.parameters.values()) == list(
            inspect.signature(amethod).parameters.values()
        )
        assert not inspect.iscoroutinefunction(getattr(Client, name))
    assert inspect.signature(Client.submit).return_annotation == "JobHandle"


def test_threads_sharing_a_client_stream_what_the_async_client_streams(fake):
    async def main() -> dict[str, tuple]:
        async with AsyncClient(fake.endpoint, timeout=5) as ac:
            out = {}
            for p in PROMPTS:
                handle = ac.generate(p, max_tokens=7)
                chunks = [c async for c in handle]
                out[p] = _shape(chunks, await handle.result())
            return out

    expected = asyncio.run(main())
    got: dict[str, tuple] = {}
    errors: list[BaseException] = []
    with Client(fake.endpoint, timeout=5) as c:

        def work(prompt: str) -> None:
            try:
                for _ in range(3):  # the same job again: the same answer every time
                    handle = c.generate(prompt, max_tokens=7)
                    shape = _shape(list(handle), handle.result())
                    assert got.setdefault(prompt, shape) == shape
                    assert c.status().model == "fake"
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(p,)) for p in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert errors == []
    assert got == expected
    assert got["ab"][2] == "abababa" and got["ab"][5] == 2


def test_a_result_that_is_late_times_out_and_the_handle_goes_on(fake):
    fake.hold = True
    with Client(fake.endpoint, timeout=5) as c:
        handle = c.submit("abc", max_tokens=4)
        assert handle.accepted() == handle.job_id
        with pytest.raises(TimeoutError, match=f"job {handle.req_id} gave no answer within 0.1 s"):
            handle.result(timeout=0.1)
        fake.step(4)
        assert handle.result(timeout=5).text == "abca"
        assert [c.text for c in handle] == []  # the result consumed the chunks


def test_close_fails_live_handles_and_keeps_what_already_arrived(fake):
    fake.hold = True
    c = Client(fake.endpoint, timeout=5)
    finished = c.submit("xy", max_tokens=2)
    finished.accepted()
    fake.step(2)
    running = c.submit("ab", max_tokens=50)
    running.accepted()
    c.status()  # answered after the first job's Finished: that one is queued now
    c.close()
    c.close()  # twice is fine
    assert finished.done is False and [ch.text for ch in finished] == ["x", "y"]
    assert finished.result().text == "xy" and finished.done
    with pytest.raises(FsdError, match="the fsd Client was closed"):
        running.result()
    with pytest.raises(FsdError, match="this fsd Client is closed"):
        c.status()
    with pytest.raises(FsdError, match="this fsd Client is closed"):
        c.submit("ab")
    # closing aborted the job still running (the fake answers "unsupported", unheard)
    deadline = time.monotonic() + 10
    while not fake.requests(P.Abort):
        assert time.monotonic() < deadline, "no Abort reached the daemon"
        time.sleep(0.01)
    assert [m.job_id for m in fake.requests(P.Abort)] == [running.job_id]
