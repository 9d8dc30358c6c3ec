"""The prefix cache seen from outside: `Finished.cached_tokens` and the SDK's
`Completion.cached_tokens`, telemetry's `JobInfo.cached_tokens` and `Snapshot.prefix`,
OpenAI's `usage.prompt_tokens_details.cached_tokens`, /metrics, and
`fsctl retune prefix_cache=false` on a live daemon.

The new fields are optional: frames without them (an older peer's) still decode, and
a peer that does not know them skips them.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import msgspec
import openai
import pytest
from typer.testing import CliRunner

from fsd import LLM, SamplingParams
from fsd import protocol as P
from fsd.client import Completion
from fsd.console.cli import app as fsctl_app
from fsd.engine.face import EngineFace
from fsd.metrics import SLOWindow
from fsd.server.loop.job_routing import finished_message
from fsd.server.publish.prom import MetricsCollector
from fsd.server.publish.telemetry import build_snapshot
from tests.server.daemon_proc import Daemon, daemon_fixture
from tests.server.test_metrics import samples, snapshot
from tests.wire_samples import PREFIX, job_row

BLOCK = 16


def finished(**kw: Any) -> P.Finished:
    return P.Finished(
        req_id="r-1", job_id="job-1", reason="length", text="ab", token_ids=[97, 98],
        timings=P.Timings(arrival=1.0), **kw,
    )  # fmt: skip


# ---- the wire ------------------------------------------------------------------------


class OldFinished(msgspec.Struct, tag="finished", tag_field="type", kw_only=True):
    """`Finished` as a peer from before `cached_tokens` has it."""

    v: int = P.PROTOCOL_VERSION
    req_id: str
    job_id: str
    reason: str
    text: str
    token_ids: list[int]
    timings: P.Timings


def test_finished_carries_cached_tokens_and_an_old_frame_reads_as_none_cached():
    back = P.decode_reply(P.encode(finished(cached_tokens=48)))
    assert isinstance(back, P.Finished) and back.cached_tokens == 48
    assert Completion.of(back, prompt_tokens=50).cached_tokens == 48
    old = P.encode(finished())  # 0 is the default: left out, as an old daemon sends it
    assert b"cached_tokens" not in old
    back = P.decode_reply(old)
    assert isinstance(back, P.Finished) and back.cached_tokens == 0
    # an old client skips the field it does not know
    skipped = msgspec.msgpack.decode(P.encode(finished(cached_tokens=48)), type=OldFinished)
    assert skipped.req_id == "r-1" and skipped.token_ids == [97, 98]


def test_a_snapshot_carries_the_prefix_counters_and_an_old_one_decodes_without():
    snap = msgspec.structs.replace(snapshot(None), prefix=PREFIX)
    back = P.decode_snapshot(P.encode(snap))
    assert back.prefix == PREFIX
    assert back.prefix.hit_rate == 0.6 and back.prefix.host_hit_rate == 0.2
    # a daemon that predates the prefix cache sends no `prefix` key at all
    fields = msgspec.to_builtins(snap)
    del fields["prefix"]
    assert P.decode_snapshot(msgspec.msgpack.encode(fields)).prefix is None


def test_a_job_row_carries_cached_tokens_and_an_old_one_decodes_as_zero():
    row = job_row()
    old = msgspec.msgpack.encode(row)
    assert b"cached_tokens" not in old
    assert msgspec.msgpack.decode(old, type=P.JobInfo).cached_tokens == 0
    cached = msgspec.structs.replace(row, cached_tokens=32)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(cached), type=P.JobInfo) == cached


# ---- the engine's numbers on the wire ------------------------------------------------

PROMPT = [(k * 37) % 251 + 1 for k in range(100)]  # 6 full blocks and 4 tokens


@pytest.fixture
def llm():
    with LLM("tiny", policy="fcfs", num_gpu_blocks=512) as llm:
        yield llm


def test_telemetry_and_finished_report_what_the_engine_reused(llm):
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    first = llm.generate(PROMPT, params)[0]
    assert finished_message(first, "r-1").cached_tokens == 0
    engine = llm.engine
    job = engine.add_request(PROMPT, params)
    engine.step()  # admitted: its cached prefix attached, the rest prefilled
    snap = P.decode_snapshot(P.encode(build_snapshot(EngineFace(engine), SLOWindow(60.0, 0.1), 1, 0.0)))
    row = next(j for j in snap.jobs or [] if j.job_id == job.job_id)
    assert row.cached_tokens == 6 * BLOCK
    stats = engine.blocks.prefix.stats()
    assert snap.prefix == P.PrefixInfo(
        enabled=True, queries=stats.queries, hits=stats.hits, host_hits=stats.host_hits,
        device_blocks=stats.device_blocks, host_blocks=stats.host_blocks,
        device_evictions=stats.device_evictions, host_evictions=stats.host_evictions,
        lookups=stats.lookups, lookup_hits=stats.lookup_hits,
    )  # fmt: skip
    assert snap.prefix.hits == 6 * BLOCK and snap.prefix.queries == 2 * len(PROMPT)
    engine.abort(job.job_id)
    again = llm.generate(PROMPT, params)[0]
    assert finished_message(again, "r-2").cached_tokens == 6 * BLOCK


# ---- /metrics --------------------------------------------------------------------------


def test_metrics_export_the_prefix_counters_by_vllm_name_and_tier():
    collector = MetricsCollector("tiny")
    collector.telemetry(P.TOPIC_SNAPSHOT, snapshot(None))  # an older daemon: no series
    assert not any("prefix_cache" in name for name, _ in samples(collector.render().decode()))
    collector.telemetry(P.TOPIC_SNAPSHOT, msgspec.structs.replace(snapshot(None), prefix=PREFIX))
    got = samples(collector.render().decode())
    assert got[("vllm:prefix_cache_queries_total", ())] == 1000
    assert got[("vllm:prefix_cache_hits_total", ())] == 600
    assert got[("fsd_prefix_cache_host_hits_total", ())] == 200
    assert got[("fsd_prefix_cache_enabled", ())] == 1
    assert got[("fsd_prefix_cache_blocks", (("tier", "device"),))] == 12
    assert got[("fsd_prefix_cache_blocks", (("tier", "host"),))] == 3
    assert got[("fsd_prefix_cache_evictions_total", (("tier", "device"),))] == 5
    assert got[("fsd_prefix_cache_evictions_total", (("tier", "host"),))] == 1


# ---- a live daemon -----------------------------------------------------------------------

CONFIG = """
[cache]
num_gpu_blocks = 128
[server]
telemetry_hz = 20
client_timeout = 5.0
"""

daemon = daemon_fixture(CONFIG, "prefix", http=True)
LONG = "The prefix cache keeps the KV of prompts it has seen: " * 2  # 110 bytes, 6 blocks


@pytest.fixture(scope="module")
def api(daemon) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{daemon.http}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()


def cached(usage: Any) -> int:
    return usage.prompt_tokens_details.cached_tokens


def test_openai_usage_counts_the_cached_prompt_tokens(api):
    kw: dict[str, Any] = {"model": "tiny", "max_tokens": 3, "extra_body": {"ignore_eos": True}}
    prompt = "completion: " + LONG  # 122 bytes (one token each): 7 full blocks
    first = api.completions.create(prompt=prompt, **kw)
    assert cached(first.usage) == 0
    second = api.completions.create(prompt=prompt, **kw)
    assert second.usage.prompt_tokens == len(prompt)
    assert cached(second.usage) == len(prompt) // BLOCK * BLOCK
    chunks = list(
        api.completions.create(
            prompt=prompt, stream=True, stream_options={"include_usage": True}, **kw
        )
    )
    assert chunks[-1].choices == [] and cached(chunks[-1].usage) == len(prompt) // BLOCK * BLOCK
    messages = [{"role": "user", "content": LONG}]
    chat = [api.chat.completions.create(messages=messages, **kw) for _ in range(2)]
    assert cached(chat[0].usage) == 0
    assert 0 < cached(chat[1].usage) <= chat[1].usage.prompt_tokens
    assert cached(chat[1].usage) % BLOCK == 0


def test_the_sdk_telemetry_and_metrics_see_the_reuse(daemon):
    prompt = "sdk: " + LONG
    with daemon.client() as c:
        assert c.complete(prompt, max_tokens=2, ignore_eos=True).cached_tokens == 0
        again = c.complete(prompt, max_tokens=2, ignore_eos=True)
    assert again.cached_tokens == len(prompt) // BLOCK * BLOCK
    snap = daemon.snapshot()
    assert snap.prefix is not None and snap.prefix.enabled
    assert snap.prefix.hits >= again.cached_tokens and snap.prefix.device_blocks > 0
    deadline, got = time.time() + 30, scrape(daemon)  # the collector sees the next snapshot
    while time.time() < deadline and got.get(("vllm:prefix_cache_hits_total", ()), 0) == 0:
        time.sleep(0.1)
        got = scrape(daemon)
    assert got[("vllm:prefix_cache_hits_total", ())] >= again.cached_tokens
    assert got[("vllm:prefix_cache_queries_total", ())] >= 2 * len(prompt)
    assert ("fsd_prefix_cache_blocks", (("tier", "host"),)) in got


def scrape(d: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{d.http}/metrics", timeout=30) as resp:
        return samples(resp.read().decode())


def fsctl(d: Daemon, *args: str) -> Any:
    options = ["--endpoint", d.endpoint, "--telemetry-endpoint", d.telemetry,
               "--state-dir", str(d.state_dir), "--timeout", "10"]  # fmt: skip
    return CliRunner().invoke(fsctl_app, [*options, *args])


def test_fsctl_retune_turns_the_prefix_cache_off_and_on_live(daemon):
    prompt = "retune: " + LONG
    with daemon.client() as c:
        c.complete(prompt, max_tokens=2, ignore_eos=True)
        bad = fsctl(daemon, "retune", "prefix_cache=maybe")
        assert bad.exit_code == 2
        assert bad.stderr == (
            "error: prefix_cache takes true or false (or on/off, yes/no), got 'maybe'\n"
        )
        off = fsctl(daemon, "retune", "prefix_cache=false")
        try:
            assert off.exit_code == 0, off.output
            assert off.stdout == "prefix_cache = False\n"
            assert c.complete(prompt, max_tokens=2, ignore_eos=True).cached_tokens == 0
            deadline, snap = time.time() + 10, daemon.snapshot()
            while snap.prefix is not None and snap.prefix.enabled and time.time() < deadline:
                snap = daemon.snapshot()
            assert snap.prefix is not None and not snap.prefix.enabled
            assert snap.prefix.device_blocks == 0  # turned off: what was cached is forgotten
            assert snap.config["cache"]["prefix_cache"] is False
        finally:
            on = fsctl(daemon, "retune", "prefix_cache=on")
        assert on.exit_code == 0 and on.stdout == "prefix_cache = True\n"
        c.complete(prompt, max_tokens=2, ignore_eos=True)  # cached again from here on
        assert c.complete(prompt, max_tokens=2, ignore_eos=True).cached_tokens > 0
