"""A daemon with refuse_wait set refuses a request predicted to wait too long for its
first token: the SDK sees code "overloaded" with `retry_after`, the HTTP API a 429 with
a Retry-After header; the jobs it took run on."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from fsd.client import RequestError
from fsd.sched.first_tokens import MIN_STARTS
from tests.server.daemon_proc import daemon_fixture

CONFIG = """
[sched]
policy = "fcfs"
max_batch_size = 1
refuse_wait = 0.000001
[cache]
num_gpu_blocks = 127
[server]
stats_interval = 1.0
"""

daemon = daemon_fixture(CONFIG, "overload-hint", http=True)
LONG = 1500  # tokens: seconds of decode on a CPU, so the job after it still waits


def warmed(c) -> None:  # noqa: ANN001 - the SDK's client
    """Enough jobs started for the daemon to measure its start rate."""
    for i in range(MIN_STARTS):
        c.submit([5 + i, 6], max_tokens=1, ignore_eos=True).result(timeout=60)


def a_waiting_job(c):  # noqa: ANN001, ANN201
    """A long job running and one more waiting behind it (fcfs, a batch of one)."""
    running = c.submit([9, 9, 9], max_tokens=LONG, ignore_eos=True)
    running.accepted(timeout=30)
    deadline = time.time() + 60
    while time.time() < deadline and not any(j.output_tokens for j in c.jobs()):
        time.sleep(0.02)  # its first token: it no longer waits
    waiting = c.submit([8, 8], max_tokens=1, ignore_eos=True)
    waiting.accepted(timeout=30)
    return running, waiting


def test_the_sdk_and_the_http_api_carry_the_retry_hint(daemon):
    with daemon.client() as c:
        warmed(c)
        running, waiting = a_waiting_job(c)
        with pytest.raises(RequestError) as err:
            c.submit([7, 7], max_tokens=1, ignore_eos=True).result(timeout=30)
        exc = err.value
        assert exc.code == "overloaded" and "refuse_wait" in exc.message
        assert exc.retry_after is not None and exc.retry_after >= 1
        body = json.dumps({"model": "tiny", "prompt": [7, 7], "max_tokens": 1}).encode()
        req = urllib.request.Request(
            f"{daemon.http}/v1/completions", data=body, method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as http_err:
            urllib.request.urlopen(req, timeout=30)
        answer = http_err.value
        assert answer.code == 429
        assert int(answer.headers["Retry-After"]) >= 1
        error = json.loads(answer.read())["error"]
        assert error["code"] == "engine_overloaded" and "refuse_wait" in error["message"]
        # what it took runs on: the waiting job finishes once the long one is aborted
        running.abort()
        assert waiting.result(timeout=60).finish_reason == "length"
    # the operator's log counts the refusals in its periodic stats lines
    deadline = time.time() + 20
    while time.time() < deadline and logged_refusals(daemon) < 2:
        time.sleep(0.1)
    assert logged_refusals(daemon) == 2, daemon.log.read_text()[-2000:]


def logged_refusals(daemon) -> int:  # noqa: ANN001
    lines = daemon.log.read_text().splitlines()
    return sum(
        int(ln.split("; ")[-1].split()[0]) for ln in lines if ln.endswith("refused as overloaded")
    )
