"""Clients take turns (issue P21 item 3) in a real daemon: while one client holds
thousands of queued jobs, another's short job runs before the backlog has had its
turn, and a CURVE key's jobs are capped over all its connections."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from fsd.client import RequestError
from fsd.server.security import generate_keys
from tests.server.daemon_proc import curve_daemon, free_port, pool_config, start_daemon

FLOOD = 5000  # jobs of one client, queued ahead of the other's
BURST = 1000


def test_another_clients_job_runs_before_a_backlog_has_had_its_turn(tmp_path, children):
    cfg = pool_config(64, 8, 1, max_jobs=20_000, max_client_jobs=20_000)
    d = start_daemon(tmp_path, cfg)
    children.append(d.proc)
    with d.client(timeout=120.0) as op:
        for _ in range(FLOOD // BURST):
            op.inject(burst=(BURST, 8, 400), tag="flood")
        with d.client(timeout=120.0, operator=False) as other:
            t0 = time.monotonic()
            done = other.complete([11, 12, 13, 14, 15, 16, 17, 18], max_tokens=2, ignore_eos=True)
            waited = time.monotonic() - t0
            flood = [j for j in op.jobs() if j.job_id != done.job_id]
        started = FLOOD - len(flood) + sum(1 for j in flood if j.output_tokens > 0)
        print(
            f"the other client's job took {waited:.2f} s; {started} of {FLOOD} flood jobs had started"
        )
        assert done.finish_reason == "length" and len(done.token_ids) == 2
        # one FIFO would have run a quantum of every flood job queued ahead of it first
        assert started < FLOOD // 10, started


def test_a_curve_keys_jobs_are_capped_over_all_its_connections(tmp_path, children):
    keys = generate_keys(tmp_path / "keys")
    d = curve_daemon(tmp_path, keys, "client-1", "max_client_jobs = 3\n")
    children.append(d.proc)
    with d.client(operator=False) as a, d.client(operator=False) as b:
        handles = [a.submit([1, 2, 3], max_tokens=500, ignore_eos=True) for _ in range(2)]
        handles.append(b.submit([1, 2, 3], max_tokens=500, ignore_eos=True))
        for h in handles:
            h.job_id  # noqa: B018 - accepted
        with pytest.raises(RequestError) as info:
            b.submit([1, 2, 3], max_tokens=5).job_id  # noqa: B018
        assert info.value.code == "overloaded" and "CURVE key" in info.value.message


def test_http_users_are_owners_by_address_and_clients_may_not_name_owners(tmp_path, children):
    port = free_port()
    cfg = pool_config(64, 2, 1, max_client_jobs=2)
    d = start_daemon(tmp_path, cfg, "--http", f"127.0.0.1:{port}")
    children.append(d.proc)
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True}

    async def from_address(
        session: aiohttp.ClientSession, live: asyncio.Event, hold: asyncio.Event
    ) -> int:
        async with session.post(url, json={**body, "stream": True}) as r:
            if r.status == 200:
                await r.content.readline()  # the first chunk: the job is live
            live.set()
            await hold.wait()  # the stream stays open, so the job stays live
            return r.status

    async def run() -> list[int]:
        far = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        hold = asyncio.Event()
        async with aiohttp.ClientSession(connector=far) as flood, aiohttp.ClientSession() as me:
            statuses = []
            tasks = []
            # the cap counts an address's jobs over every link of the HTTP frontend
            for session in (flood, flood, flood, me):
                live = asyncio.Event()
                tasks.append(asyncio.create_task(from_address(session, live, hold)))
                await live.wait()
            hold.set()
            statuses = [await task for task in tasks]
            return statuses

    assert asyncio.run(run()) == [200, 200, 429, 200]
    with d.client(operator=False) as plain, pytest.raises(RequestError) as info:
        plain.complete([1, 2], max_tokens=1, owner="someone-else")
    assert info.value.code == "forbidden"
