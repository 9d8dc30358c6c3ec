"""HTTP users do not share one link (issue P21, item 4): a pool of engine links.

Requests spread over the links; a link that fails is retired and replaced, and only
the requests on it fail; a real daemon whose busiest link has its socket closed
under it finishes the streams on the other links whole, serves new requests and
leaves no job behind.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai

from fsd.client import DaemonUnavailable, RequestError
from fsd.errors import FsdError
from fsd.server.http.links import LinkPool, link_failed
from tests.server.daemon_proc import free_port, start_daemon

CONFIG = "[cache]\nnum_gpu_blocks = 200\n[server]\nclient_timeout = 3.0\n"


class _Client:
    def __init__(self) -> None:
        self.closed = False
        self.aborted: list[str] = []

    async def close(self) -> None:
        self.closed = True

    async def abort(self, job_id: str) -> dict[str, Any]:
        self.aborted.append(job_id)
        return {}


class _Handle:
    finished, done, job_id = False, True, "job-3"


def test_requests_spread_and_a_failed_link_is_replaced_after_its_requests_end():
    async def run() -> None:
        pool = LinkPool(_Client, size=4)  # type: ignore[arg-type]
        picked = [pool.pick() for _ in range(8)]
        assert sorted(li.busy for li in pool.links) == [2, 2, 2, 2]
        broken = picked[0]
        old = broken.client
        pool.retire(broken, FsdError("socket closed"))
        pool.retire(broken, FsdError("socket closed"))  # its second request: once only
        assert broken not in pool.links and pool.retired == 1 and len(pool.links) == 4
        assert pool.pick() is not broken  # new requests go to the live links
        pool.abandon(broken, _Handle())  # type: ignore[arg-type]
        pool.release(broken)
        await asyncio.sleep(0)
        assert not old.closed  # one request still on it
        pool.release(broken)
        for _ in range(10):
            await asyncio.sleep(0)
        assert old.closed and old.aborted == ["job-3"]  # the abort went first
        await pool.close()
        assert all(li.client.closed for li in pool.links)  # type: ignore[attr-defined]

    asyncio.run(run())


def test_which_errors_say_the_link_failed():
    assert link_failed(FsdError("the fsd AsyncClient's socket was closed"))
    assert link_failed(DaemonUnavailable("no answer"))
    assert link_failed(RequestError("lost", "job lost while reconnecting"))
    assert not link_failed(RequestError("overloaded", "too many jobs"))
    assert not link_failed(RequestError("invalid", "bad"))


# ---- a real daemon -----------------------------------------------------------------


def _stream(api: openai.OpenAI, prompt: str, n: int, started: threading.Event) -> str:
    kw = {"model": "tiny", "prompt": prompt, "max_tokens": n, "extra_body": {"ignore_eos": True}}
    parts = []
    for ch in api.completions.create(**kw, stream=True):
        parts.append(ch.choices[0].text)
        started.set()
    return "".join(parts)


def test_a_broken_link_fails_only_its_own_streams(tmp_path: Path):
    trigger = tmp_path / "break"
    port = free_port()
    d = start_daemon(
        tmp_path, CONFIG, "--http", f"127.0.0.1:{port}",
        module="tests.server.link_breaker", env={"FSD_BREAK_LINK": str(trigger)},
    )  # fmt: skip
    try:
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        prompts = [f"link {k}" for k in range(8)]
        n = 120
        with d.client() as c:  # greedy: what each stream must say
            want = [c.complete(p, max_tokens=n, ignore_eos=True).text for p in prompts]
        started = [threading.Event() for _ in prompts]
        with ThreadPoolExecutor(8) as pool:
            streams = [pool.submit(_stream, api, p, n, e) for p, e in zip(prompts, started, strict=True)]
            assert all(e.wait(120) for e in started)  # 8 streams, 2 on each link
            trigger.touch()
            outcomes = []
            for s in streams:
                try:
                    outcomes.append(s.result(timeout=180))
                except openai.APIError as exc:
                    outcomes.append(exc)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        assert 1 <= len(failed) <= 2, outcomes  # the busiest link's streams only
        assert all("engine link failed" in str(f) for f in failed), failed
        for got, expect in zip(outcomes, want, strict=True):
            if not isinstance(got, Exception):
                assert got == expect  # the other links' streams, whole
        done = api.completions.create(model="tiny", prompt="after", max_tokens=4)
        assert done.choices[0].finish_reason == "length"  # a new link serves
        api.close()
        with d.client() as c:  # the broken link's jobs: reaped with its silent session
            deadline = time.time() + 60
            while time.time() < deadline and c.jobs():
                time.sleep(0.1)
            assert c.jobs() == []
        assert not trigger.exists()
    finally:
        assert d.stop() == 0
    assert "an engine link failed" in d.log.read_text()
