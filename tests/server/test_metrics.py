"""/metrics: the collector on synthetic telemetry, and a real daemon scraped after work."""

from __future__ import annotations

import time
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families

from fsd import protocol as P
from fsd.engine.output import RequestOutput
from fsd.server.prom import MetricsCollector
from tests.server.daemon_proc import Daemon, daemon_fixture


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels without model_name): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def job(job_id: str, state: str, kv: str, enst: float | None) -> P.JobInfo:
    return P.JobInfo(
        job_id=job_id,
        state=state,
        level=0,
        kv=kv,
        blocks=1,
        host_blocks=0,
        enst=enst,
        prompt_tokens=3,
        output_tokens=1,
        waited=0.0,
        attained=0.0,
        arrival=0.0,
    )


def snapshot(jobs: list[P.JobInfo] | None) -> P.Snapshot:
    return P.Snapshot(
        time=100.0,
        seq=1,
        policy="sj-mlfq",
        levels=[
            P.LevelInfo(index=0, quantum=0.01, job_ids=["a", "b"]),
            P.LevelInfo(index=1, quantum=0.02, job_ids=["c"]),
        ],
        jobs=jobs,
        kv=P.KVInfo(
            block_size=16,
            device_total=100,
            device_used=25,
            device_reserved=7,
            device_free=75,
            host_total=400,
            host_used=4,
            bytes_in_flight=0,
            swapped_out_bytes=4096,
            swapped_in_bytes=1024,
        ),
        iterations=[],
        slo=P.SLOInfo(
            window=60.0,
            finished=1,
            avg_per_token_latency=0.02,
            p95_per_token_latency=0.05,
            avg_ttft=0.1,
            p95_ttft=0.2,
            tokens_per_s=1.0,
            requests_per_s=0.1,
            slo_per_token_latency=0.1,
        ),
        config={"cache": {"kv_policy": "proactive"}},
    )


def test_the_collector_turns_telemetry_into_vllm_and_fsd_metrics():
    m = MetricsCollector("tiny")
    m.telemetry(
        P.TOPIC_SNAPSHOT,
        snapshot(
            [
                job("a", "running", "device", 0.0),
                job("b", "preempted", "host", 0.25),
                job("c", "preempted", "host", 0.5),
            ]
        ),
    )
    m.telemetry(P.TOPIC_SNAPSHOT, snapshot(None))  # a paced snapshot keeps the table's numbers
    for kind in (
        "preempt",
        "preempt",
        "promote",
        "demote",
        "swap-out-begin",
        "swap-in-begin",
        "swap-out-end",
        "arrive",
    ):
        m.telemetry(P.TOPIC_EVENT, P.Event(time=1.0, kind=kind, job_id="a"))
    m.job_finished(
        RequestOutput(
            request_id="a",
            prompt=None,
            prompt_token_ids=[1, 2, 3],
            text="xyz",
            token_ids=[4, 5, 6],
            finish_reason="length",
            arrival_time=10.0,
            first_token_time=10.5,
            finish_time=11.5,
            token_times=[10.5, 11.0, 11.5],
        )
    )
    got = samples(m.render().decode())
    assert got[("vllm:num_requests_running", ())] == 1
    assert got[("vllm:num_requests_waiting", ())] == 2
    assert got[("vllm:num_requests_swapped", ())] == 2
    assert got[("vllm:kv_cache_usage_perc", ())] == 0.25
    assert got[("vllm:num_preemptions_total", ())] == 2
    assert got[("fsd_promotions_total", ())] == 1 and got[("fsd_demotions_total", ())] == 1
    assert got[("fsd_swaps_total", (("direction", "out"),))] == 1
    assert got[("fsd_swaps_total", (("direction", "in"),))] == 1
    assert got[("fsd_swap_bytes_total", (("direction", "out"),))] == 4096
    assert got[("fsd_queue_length", (("level", "1"),))] == 2
    assert got[("fsd_queue_length", (("level", "2"),))] == 1
    assert got[("fsd_queue_quantum_seconds", (("level", "2"),))] == 0.02
    assert got[("fsd_kv_reserve_blocks", ())] == 7
    assert got[("fsd_next_swap_in_enst_seconds", ())] == 0.25
    assert got[("fsd_kv_device_blocks", (("state", "free"),))] == 75
    assert got[("vllm:request_success_total", (("finished_reason", "length"),))] == 1
    assert got[("vllm:prompt_tokens_total", ())] == 3
    assert got[("vllm:generation_tokens_total", ())] == 3
    assert got[("vllm:time_to_first_token_seconds_sum", ())] == 0.5
    assert got[("vllm:e2e_request_latency_seconds_sum", ())] == 1.5
    assert got[("vllm:inter_token_latency_seconds_count", ())] == 2
    assert got[("vllm:inter_token_latency_seconds_bucket", (("le", "0.5"),))] == 2
    assert got[("fsd_info", (("kv_policy", "proactive"), ("policy", "sj-mlfq")))] == 1


def test_no_gauges_before_the_first_snapshot():
    got = samples(MetricsCollector("tiny").render().decode())
    assert not any(name == "vllm:num_requests_running" for name, _ in got)
    assert got[("vllm:time_to_first_token_seconds_count", ())] == 0


# ---- a real daemon -----------------------------------------------------------------

CONFIG = """
[cache]
num_gpu_blocks = 48
[server]
telemetry_hz = 20
"""


daemon = daemon_fixture(CONFIG, "metrics", http=True)


def scrape(d: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{d.http}/metrics", timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        return samples(resp.read().decode())


def test_metrics_reflect_the_work_done(daemon):
    stop = ("vllm:request_success_total", (("finished_reason", "length"),))
    before = scrape(daemon)
    api = openai.OpenAI(base_url=f"{daemon.http}/v1", api_key="unused", max_retries=0)
    for prompt in ("one", "two", "three"):
        api.completions.create(
            model="tiny", prompt=prompt, max_tokens=6, extra_body={"ignore_eos": True}
        )
    with daemon.client() as c:  # jobs from the ZeroMQ SDK count too
        c.complete("four", max_tokens=6, ignore_eos=True)
    api.close()
    deadline = time.time() + 30  # the pump applies what telemetry fed every half second
    after = scrape(daemon)
    while time.time() < deadline and after.get(stop, 0) - before.get(stop, 0) < 4:
        time.sleep(0.2)
        after = scrape(daemon)
    assert after[stop] - before.get(stop, 0) == 4
    ttft = ("vllm:time_to_first_token_seconds_count", ())
    assert after[ttft] - before[ttft] == 4
    gen = ("vllm:generation_tokens_total", ())
    assert after[gen] - before[gen] == 24
    itl = ("vllm:inter_token_latency_seconds_count", ())
    assert after[itl] - before[itl] == 4 * 5
    levels = {dict(lab)["level"] for name, lab in after if name == "fsd_queue_length"}
    assert levels == {str(i) for i in range(1, 9)}  # Q1..Q8 of the default sj-mlfq
    assert after[("fsd_kv_device_blocks", (("state", "total"),))] == 48
    assert ("fsd_kv_reserve_blocks", ()) in after
    assert ("vllm:num_requests_running", ()) in after
    assert after[("vllm:kv_cache_usage_perc", ())] >= 0
