"""A handle's abort that loses the race with its job's end is not an error: the job
ended on its own first (its Finished is already on the way, ahead of the daemon's
"unknown-job" reply on the same socket), so the abort answers what it ended with and
the result keeps its own finish reason. An abort of an id the client never had still
raises "unknown-job", and so does a handle's abort whose end never comes."""

from __future__ import annotations

import asyncio
import time

import pytest

from fsd import protocol as P
from fsd.client import AsyncClient, RequestError


def _ended(client, job_id: str) -> bool:
    try:
        client.job(job_id)
    except RequestError as exc:
        assert exc.code == "unknown-job"
        return True
    return False


def test_a_sync_handle_aborted_after_its_job_finished_returns_its_end(daemon):
    with daemon.client() as c:
        handle = c.submit([5, 6, 7], max_tokens=4, ignore_eos=True)
        first = next(iter(handle))  # the rest arrives while this client looks away
        deadline = time.monotonic() + 30
        while not _ended(c, handle.job_id):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        detail = handle.abort()
        out = handle.result()
        assert detail == {"job_id": handle.job_id, "tokens": 4, "ended": "length"}
        assert (
            out.finish_reason == "length"
            and out.token_ids[: len(first.token_ids)] == first.token_ids
        )
        with pytest.raises(RequestError, match="unknown-job"):
            c.abort("job-404")


def test_an_async_handle_aborted_after_its_job_finished_returns_its_end(daemon):
    async def main() -> None:
        async with AsyncClient(daemon.endpoint, timeout=10) as c:
            handle = await c.submit([8, 9], max_tokens=3, ignore_eos=True)
            async for _chunk in handle:
                break
            job_id = await handle.accepted()
            while any(j.job_id == job_id for j in await c.jobs()):
                await asyncio.sleep(0.01)
            detail = await handle.abort()
            assert detail == {"job_id": job_id, "tokens": 3, "ended": "length"}
            assert (await handle.result()).finish_reason == "length"
            with pytest.raises(RequestError, match="unknown-job"):
                await c.abort("job-404")

    asyncio.run(main())


def test_an_abort_answered_before_the_end_arrives_waits_for_it(fake):
    """The daemon may say "unknown-job" before it has sent the job's end (its engine
    let go of the job first): the handle waits for the end, up to its timeout."""
    fake.hold = True

    async def main() -> None:
        async with AsyncClient(fake.endpoint, timeout=1.0) as c:
            handle = await c.submit("ab", max_tokens=2)
            await handle.accepted()
            aborting = asyncio.ensure_future(handle.abort())
            while not fake.requests(P.Abort):
                await asyncio.sleep(0.005)
            fake.step(2)  # after the refusal: the end follows it
            assert await aborting == {"job_id": handle.job_id, "tokens": 2, "ended": "length"}
            assert (await handle.result()).text == "ab"

    asyncio.run(main())


def test_an_abort_whose_end_never_comes_is_refused(fake):
    fake.hold = True

    async def main() -> None:
        async with AsyncClient(fake.endpoint, timeout=0.5) as c:
            handle = await c.submit("ab", max_tokens=2)
            with pytest.raises(RequestError, match="unknown-job"):
                await handle.abort()
            fake.step(2)  # the stream still ends as it would have
            assert (await handle.result()).finish_reason == "length"

    asyncio.run(main())
