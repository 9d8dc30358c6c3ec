"""HTTP users do not share one fate (issue P21, item 4).

A failing HTTP call fails only itself; a job whose HTTP client is gone is aborted,
also when its handle ended in an error; a daemon that stalled does not take its own
deafness for its clients' silence (which aborted every HTTP stream at once).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from fsd import protocol as P
from fsd.client import DaemonUnavailable
from fsd.config import ServerConfig
from fsd.errors import UnknownJobError
from fsd.metrics import SLOWindow
from fsd.server.http.api import build_app
from fsd.server.http.links import LinkPool
from fsd.server.loop.clients import ClientBook
from fsd.server.loop.job_routing import JobRouter
from fsd.server.roles import Caller
from tests.server.daemon_proc import daemon_fixture
from tests.server.test_http_api import offline_backend

# a frame cap of 64 KiB: a 200 KB body is refused (413) while streams run beside it
CONFIG = "[cache]\nnum_gpu_blocks = 40\n[server]\nclient_timeout = 5.0\nmax_frame_bytes = 65536\n"

daemon = daemon_fixture(CONFIG, "http-isolation", http=True)


# ---- the reaper --------------------------------------------------------------------


class _Face:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, job_id: str) -> Any:
        self.aborted.append(job_id)
        raise UnknownJobError(job_id)  # ended meanwhile: the reaper goes on


def test_a_stalled_daemon_does_not_reap_clients_it_did_not_listen_to():
    book = ClientBook(ServerConfig())
    face = _Face()
    router = JobRouter(face, book, lambda ident, msg: None, SLOWindow(60.0, 0.1))  # type: ignore[arg-type]
    client = book.heard(b"route", 100.0, None)  # last heard at t=100
    book.own("job-1", Caller(client.key), "req-1")
    # the daemon last read every waiting frame at t=100.5: its pings may still wait
    assert router.reap_silent_clients(timeout=1.0, heard_until=100.5) == []
    assert face.aborted == [] and client.jobs
    # it listened until t=102 and heard nothing: silent, reaped
    assert router.reap_silent_clients(timeout=1.0, heard_until=102.0) == [client.key]
    assert face.aborted == ["job-1"]


# ---- a handle that ended in an error -----------------------------------------------


class _BrokenLinkJob:
    """Accepted as job-7, one chunk, then the link fails (the job runs on)."""

    prompt_tokens = 1
    job_id = "job-7"
    done = True  # ended, in an error
    finished = False

    async def accepted(self) -> str:
        return self.job_id

    async def result(self) -> Any:
        raise DaemonUnavailable("the link failed")

    def __aiter__(self) -> Any:
        return self._chunks()

    async def _chunks(self) -> Any:
        yield P.Chunk(req_id="r-7", job_id="job-7", token_ids=[65], text="A")
        raise DaemonUnavailable("the link failed")


class _Link:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def generate(
        self, prompt: Any, params: Any = None, affinity: Any = None, owner: Any = None
    ) -> _BrokenLinkJob:
        return _BrokenLinkJob()

    async def abort(self, job_id: str) -> dict[str, Any]:
        self.aborted.append(job_id)
        return {}


@pytest.mark.parametrize("stream", [True, False])
def test_a_job_whose_handle_ended_in_an_error_is_aborted(stream):
    backend = offline_backend()
    link = _Link()
    backend.links = LinkPool(lambda: link, size=1)  # type: ignore[arg-type,return-value]
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": stream}

    async def run() -> None:
        async with TestClient(TestServer(build_app(backend, 1 << 20))) as http:
            r = await http.post("/v1/completions", json=body)
            await r.read()
            assert r.status == (200 if stream else 503)
            for _ in range(100):  # the abort runs in a task of its own
                if link.aborted:
                    break
                await asyncio.sleep(0.01)
        assert link.aborted == ["job-7"]

    asyncio.run(run())


# ---- a real daemon -----------------------------------------------------------------


def _post(url: str, body: bytes) -> int:
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _stream(api: openai.OpenAI, prompt: str, n: int) -> str:
    kw = {"model": "tiny", "prompt": prompt, "max_tokens": n, "extra_body": {"ignore_eos": True}}
    return "".join(ch.choices[0].text for ch in api.completions.create(**kw, stream=True))


def test_failing_calls_leave_the_other_streams_whole_and_no_job_behind(daemon):
    api = openai.OpenAI(base_url=f"{daemon.http}/v1", api_key="unused", max_retries=0)
    prompts = [f"stream {k}" for k in range(4)]
    with daemon.client() as c:  # greedy: what each stream must say
        want = [c.complete(p, max_tokens=40, ignore_eos=True).text for p in prompts]
    url = f"{daemon.http}/v1/completions"
    with ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(_stream, api, p, 40) for p in prompts]
        # meanwhile: a body past max_frame_bytes, a prompt past the context, and a
        # client that leaves its stream after one chunk
        big = json.dumps({"model": "tiny", "prompt": "x" * 200_000, "max_tokens": 2})
        long = json.dumps({"model": "tiny", "prompt": "y" * 3000, "max_tokens": 2})
        assert _post(url, big.encode()) == 413
        assert _post(url, long.encode()) == 400
        left = api.completions.create(
            model="tiny", prompt="leave", max_tokens=600, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        next(iter(left))
        left.close()
        assert [s.result(timeout=120) for s in streams] == want
    api.close()
    with daemon.client() as c:  # the one that left was aborted; nothing runs on
        deadline = time.time() + 60
        while time.time() < deadline and c.jobs():
            time.sleep(0.05)
        assert c.jobs() == []
