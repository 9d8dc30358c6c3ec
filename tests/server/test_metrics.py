"""/metrics: the collector on synthetic telemetry, and a real daemon scraped after work."""

from __future__ import annotations

import time
import urllib.request

import msgspec
import openai
from prometheus_client.parser import text_string_to_metric_families

from fsd import protocol as P
from fsd.engine.output import RequestOutput
from fsd.server.publish.prom import MetricsCollector
from tests.server.daemon_proc import Daemon, daemon_fixture
from tests.wire_samples import job_row, kv_info, slo_info


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels without model_name): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def job(job_id: str, state: str, kv: str, enst: float | None) -> P.JobInfo:
    return job_row(
        job_id=job_id, state=state, kv=kv, blocks=1, enst=enst, prompt_tokens=3,
        output_tokens=1, attained=0.0, arrival=0.0,
    )  # fmt: skip


def snapshot(jobs: list[P.JobInfo] | None) -> P.Snapshot:
    kv = kv_info(
        device_used=25, device_reserved=7, device_free=75, host_used=4,
        swapped_out_bytes=4096, swapped_in_bytes=1024,
    )  # fmt: skip
    slo = slo_info(
        finished=1, avg_per_token_latency=0.02, p95_per_token_latency=0.05, avg_ttft=0.1,
        p95_ttft=0.2, tokens_per_s=1.0, requests_per_s=0.1, slo_per_token_latency=0.1,
    )  # fmt: skip
    return P.Snapshot(
        time=100.0,
        seq=1,
        policy="sj-mlfq",
        levels=[
            P.LevelInfo(index=1, quantum=0.01, job_ids=["a", "b"]),  # 1-based: Q1
            P.LevelInfo(index=2, quantum=0.02, job_ids=["c"]),
        ],
        jobs=jobs,
        kv=kv,
        iterations=[],
        slo=slo,
        config={"cache": {"kv_policy": "proactive"}},
    )


def output(job_id: str, arrival: float, times: list[float], prompt: int = 3) -> RequestOutput:
    """A finished job's result: one output token at each of `times`."""
    return RequestOutput(
        request_id=job_id,
        prompt=None,
        prompt_token_ids=list(range(1, prompt + 1)),
        text="x" * len(times),
        token_ids=[4] * len(times),
        finish_reason="length",
        arrival_time=arrival,
        first_token_time=times[0] if times else None,
        finish_time=times[-1] if times else None,
        token_times=times,
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
    assert got[("vllm:gpu_cache_usage_perc", ())] == 0.25  # vLLM's older name
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
    # vLLM v1 observes time per output token per token gap, like the inter-token latency
    assert got[("vllm:time_per_output_token_seconds_count", ())] == 2
    assert got[("vllm:time_per_output_token_seconds_sum", ())] == 1.0
    assert got[("vllm:request_prompt_tokens_count", ())] == 1
    assert got[("vllm:request_prompt_tokens_bucket", (("le", "2.0"),))] == 0
    assert got[("vllm:request_prompt_tokens_bucket", (("le", "5.0"),))] == 1
    assert got[("vllm:request_generation_tokens_sum", ())] == 3
    assert got[("fsd_info", (("kv_policy", "proactive"), ("policy", "sj-mlfq")))] == 1


def test_queue_time_pairs_arrival_with_the_start_event_in_either_order():
    m = MetricsCollector("tiny")
    # "a": its start event before its result; "b": its result first (the engine thread
    # queues a result at once, events come in batches from the publisher)
    m.telemetry(P.TOPIC_EVENT, P.Event(time=10.25, kind="start", job_id="a"))
    m.job_finished(output("a", 10.0, [10.5, 11.0]))
    m.job_finished(output("b", 20.0, [21.5]))
    m.render()
    m.telemetry(P.TOPIC_EVENT, P.Event(time=21.0, kind="start", job_id="b"))
    m.telemetry(P.TOPIC_EVENT, P.Event(time=21.5, kind="finish", job_id="b"))
    # "c" was aborted before it ran: no start event comes, and nothing waits for one
    m.job_finished(output("c", 30.0, []))
    m.telemetry(P.TOPIC_EVENT, P.Event(time=30.1, kind="abort", job_id="c"))
    got = samples(m.render().decode())
    assert got[("vllm:request_queue_time_seconds_count", ())] == 2
    assert got[("vllm:request_queue_time_seconds_sum", ())] == 0.25 + 1.0
    assert got[("vllm:request_queue_time_seconds_bucket", (("le", "0.3"),))] == 1
    assert m.unpaired == 0


def test_every_metric_carries_the_model_name():
    m = MetricsCollector("tiny")
    m.telemetry(P.TOPIC_SNAPSHOT, snapshot([job("a", "host", "host", 0.5)]))
    for kind in ("preempt", "promote", "demote", "recompute", "swap-out-begin", "start"):
        m.telemetry(P.TOPIC_EVENT, P.Event(time=1.0, kind=kind, job_id="a"))
    m.job_finished(output("a", 0.5, [1.5, 2.0]))
    names = set()
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            assert s.labels.get("model_name") == "tiny", s
            names.add(family.name)
    fsd = {n for n in names if n.startswith("fsd_")}
    assert {"fsd_promotions", "fsd_queue_length", "fsd_kv_device_blocks", "fsd_info"} <= fsd
    assert "fsd_next_swap_in_enst_seconds" in fsd and "fsd_swap_bytes" in fsd


def test_refused_requests_are_counted():
    m = MetricsCollector("tiny")
    assert samples(m.render().decode())[("fsd_requests_refused_overloaded_total", ())] == 0
    for job_id in ("a", "b"):
        m.telemetry(P.TOPIC_EVENT, P.Event(time=1.0, kind="refuse", job_id=job_id))
    assert samples(m.render().decode())[("fsd_requests_refused_overloaded_total", ())] == 2


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
    queued = ("vllm:request_queue_time_seconds_count", ())
    while time.time() < deadline and (
        after.get(stop, 0) - before.get(stop, 0) < 4 or after[queued] - before[queued] < 4
    ):
        time.sleep(0.2)
        after = scrape(daemon)
    assert after[queued] - before[queued] == 4  # each job's start event paired with it
    assert after[stop] - before.get(stop, 0) == 4
    ttft = ("vllm:time_to_first_token_seconds_count", ())
    assert after[ttft] - before[ttft] == 4
    gen = ("vllm:generation_tokens_total", ())
    assert after[gen] - before[gen] == 24
    itl = ("vllm:inter_token_latency_seconds_count", ())
    assert after[itl] - before[itl] == 4 * 5
    tpot = ("vllm:time_per_output_token_seconds_count", ())
    assert after[tpot] - before[tpot] == 4 * 5
    for name in ("vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count"):
        assert after[(name, ())] - before[(name, ())] == 4
    generated = ("vllm:request_generation_tokens_bucket", (("le", "5.0"),))
    assert after[generated] == before[generated]  # six tokens each: above 5
    levels = {dict(lab)["level"] for name, lab in after if name == "fsd_queue_length"}
    assert levels == {str(i) for i in range(1, 9)}  # Q1..Q8 of the default sj-mlfq
    assert after[("fsd_kv_device_blocks", (("state", "total"),))] == 48
    assert ("fsd_kv_reserve_blocks", ()) in after
    assert ("vllm:num_requests_running", ()) in after
    assert after[("vllm:kv_cache_usage_perc", ())] >= 0
    assert after[("vllm:gpu_cache_usage_perc", ())] == after[("vllm:kv_cache_usage_perc", ())]


def test_a_daemon_of_several_replicas_labels_each_ones_gauges():
    m = MetricsCollector("tiny")
    replicas = [
        P.ReplicaInfo(index=0, live=3, running=2, kv=kv_info(device_used=10, device_total=64)),
        P.ReplicaInfo(index=1, health="worker lost", live=0, kv=kv_info(device_total=64)),
    ]
    m.telemetry(P.TOPIC_SNAPSHOT, msgspec.structs.replace(snapshot(None), replicas=replicas))
    got = samples(m.render().decode())
    assert got[("fsd_replica_requests", (("replica", "0"), ("state", "live")))] == 3
    assert got[("fsd_replica_requests", (("replica", "0"), ("state", "running")))] == 2
    assert got[("fsd_replica_kv_device_blocks", (("replica", "1"), ("state", "total")))] == 64
    assert got[("fsd_replica_up", (("replica", "0"),))] == 1
    assert got[("fsd_replica_up", (("replica", "1"),))] == 0
    one = MetricsCollector("tiny")  # one replica: no replica gauges
    one.telemetry(P.TOPIC_SNAPSHOT, snapshot(None))
    assert not any(name.startswith("fsd_replica") for name, _ in samples(one.render().decode()))


def test_the_process_gauges_count_what_the_daemon_holds():
    import gc
    import threading

    got = samples(MetricsCollector("tiny").render().decode())
    assert got[("process_threads", ())] >= threading.active_count()
    assert got[("process_open_fds", ())] > 0 and got[("process_resident_memory_bytes", ())] > 1e6
    assert got[("fsd_python_gc_objects", ())] > 0.5 * len(gc.get_objects())
    assert got[("fsd_python_allocated_blocks", ())] > 0
    keep = [str(i) * 40 for i in range(20_000)]  # Python blocks this process now holds
    after = samples(MetricsCollector("tiny").render().decode())
    assert after[("fsd_python_allocated_blocks", ())] - got[("fsd_python_allocated_blocks", ())] >= 19_000
    del keep
