"""A real daemon on loopback: streaming, control, bad input, silent clients, load."""

from __future__ import annotations

import multiprocessing as mp
import time

import msgspec
import pytest
import zmq

from fsd import protocol as P
from fsd.client import Client, RequestError
from tests.server.daemon_proc import Daemon, daemon_fixture, raw

CONFIG = """
[cache]
num_gpu_blocks = 48
num_host_blocks = 256
[sched]
max_batch_size = 16
[server]
telemetry_hz = 20
client_timeout = 2.0
max_frame_bytes = 65536
"""


daemon = daemon_fixture(CONFIG, "daemon")


def wait_idle(d: Daemon, timeout: float = 60.0) -> P.Snapshot:
    deadline = time.time() + timeout
    while time.time() < deadline:
        snap = d.snapshot()
        if not any(lv.job_ids for lv in snap.levels) and snap.kv.bytes_in_flight == 0:
            return snap
    raise AssertionError("the daemon did not become idle")


def test_generate_streams_chunks_that_add_up_to_the_completion(daemon):
    with daemon.client() as c:
        handle = c.generate("stream me", max_tokens=12, ignore_eos=True)
        chunks = list(handle)
        done = handle.result()
        assert done.finish_reason == "length" and len(done.token_ids) == 12
        assert "".join(ch.text for ch in chunks) == done.text
        assert [t for ch in chunks for t in ch.token_ids] == done.token_ids
        again = c.complete("stream me", max_tokens=12, ignore_eos=True)
        assert again.token_ids == done.token_ids
        assert again.ttft is not None and again.per_token_latency is not None
        status = c.status()
        # the engine thread's time is accounted: iterations ran, telemetry (20 Hz) read
        assert status.iterations >= 24 and status.step_seconds > 0
        assert 0 < status.telemetry_seconds < status.uptime


def reply(s: zmq.Socket) -> P.Reply:
    assert s.poll(10_000), "no reply"
    return P.decode_reply(s.recv())


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([b"\xc1\xc1garbage"], "malformed"),
        ([msgspec.msgpack.encode({"type": "teleport", "v": 1})], "unknown-type"),
        ([msgspec.msgpack.encode({"type": "status", "v": 99})], "bad-version"),
        ([msgspec.msgpack.encode({"type": "submit", "v": 1})], "invalid"),
        ([b"x" * 70_000], "too-large"),
        ([P.encode(P.Status()), b"extra"], "malformed"),
        ([P.encode(P.Submit(req_id="r", prompt="x", sampling=P.Sampling(top_p=0.0)))], "invalid"),
        ([P.encode(P.Submit(req_id="r", prompt_token_ids=[1] * 5000))], "prompt-too-long"),
        ([P.encode(P.Submit(req_id="r"))], "invalid"),
        ([P.encode(P.Abort(job_id="job-none"))], "unknown-job"),
        ([P.encode(P.GetJob(job_id="job-none"))], "unknown-job"),
        ([P.Retune(changes={"quanta": [2.0, 1.0]})], "invalid-setting"),
        ([P.Retune(changes={"warp": 9})], "invalid-setting"),
        ([P.Retune(changes={"fsd.threshold": {"x": [1]}})], "invalid-setting"),
        ([P.Retune(changes={"fsd.alpha": 0})], "invalid-setting"),
        ([P.Inject(burst=P.Burst(count=0, input_len=1, output_len=1))], "invalid"),
        ([P.Inject(burst=P.Burst(count=1, input_len=10**9, output_len=1))], "prompt-too-long"),
        (
            [
                P.Inject(
                    scenario="[scenario]\nduration = 1\n[[phase]]\narrival = 'trace'\n"
                    "trace = '/etc/passwd'\n",
                    req_id="s",
                )
            ],
            "invalid",
        ),
        ([P.Drain(timeout=float("nan"))], "invalid"),
        ([P.Shutdown(timeout=-1.0)], "invalid"),
        # invalid UTF-8 in the tag: msgspec raised UnicodeDecodeError, which killed the daemon
        ([b"\x81\xa4type\xa1\xff"], "malformed"),
        ([b"\x82\xa4type\xa6submit\xa6req_id\xa2\xff\xfe"], "malformed"),
        (
            [
                msgspec.msgpack.encode(
                    {
                        "type": "submit",
                        "v": 2,
                        "req_id": "r",
                        "prompt": "x",
                        "sampling": {"temperature": float("nan")},
                    }
                )
            ],
            "invalid",
        ),
        (
            [
                msgspec.msgpack.encode(
                    {"type": "submit", "v": 2, "req_id": "r" * 300, "prompt": "x"}
                )
            ],
            "invalid",
        ),
        (
            [
                msgspec.msgpack.encode(
                    {"type": "submit", "v": 2, "req_id": "r", "prompt": "x", "tags": ["t"] * 100}
                )
            ],
            "invalid",
        ),
    ],
)
def test_bad_input_gets_a_coded_error_and_the_daemon_serves_on(daemon, frames, code):
    # operator requests carry the token: their refusal must come from the bad value
    frames = [
        f if isinstance(f, bytes) else P.encode(msgspec.structs.replace(f, token=daemon.token))
        for f in frames
    ]
    s = raw(daemon)
    try:
        s.send_multipart(frames)
        msg = reply(s)
        assert isinstance(msg, P.Error) and msg.code == code, msg
        assert msg.message
    finally:
        s.close()
    with daemon.client() as c:
        assert len(c.complete([1, 2, 3], max_tokens=2, ignore_eos=True).token_ids) == 2


def test_client_errors_carry_the_code(daemon):
    with daemon.client() as c:
        with pytest.raises(RequestError) as info:
            c.complete([1] * 5000, max_tokens=2)
        assert info.value.code == "prompt-too-long"
        with pytest.raises(RequestError) as info:
            c.abort("job-none")
        assert info.value.code == "unknown-job"


def test_a_max_tokens_past_the_context_is_refused_naming_the_limit(daemon):
    # it was cut to the context silently; a client now hears the limit (as vLLM answers)
    with daemon.client() as c:
        with pytest.raises(RequestError) as info:
            c.complete([1, 2, 3], max_tokens=10**9)
        assert info.value.code == "prompt-too-long"
        assert "context of 2048 tokens; ask for at most 2045" in info.value.message
        assert len(c.complete([1, 2, 3], max_tokens=2, ignore_eos=True).token_ids) == 2


def test_a_silent_client_loses_its_jobs_and_their_blocks(daemon):
    s = raw(daemon)
    s.send(
        P.encode(
            P.Submit(
                req_id="long",
                prompt_token_ids=[5] * 40,
                sampling=P.Sampling(max_tokens=600, ignore_eos=True),
            )
        )
    )
    accepted = reply(s)
    assert isinstance(accepted, P.Accepted)
    s.close()  # no more heartbeats
    deadline = time.time() + 30
    with daemon.client() as c:
        while time.time() < deadline and any(j.job_id == accepted.job_id for j in c.jobs()):
            time.sleep(0.2)
        assert all(j.job_id != accepted.job_id for j in c.jobs())
    snap = wait_idle(daemon)
    assert snap.kv.device_used == 0 and snap.kv.host_used == 0


def test_retune_inject_list_and_get_job(daemon):
    with daemon.client() as c:
        cfg = c.retune(policy="mlfq", quanta=[0.01, 0.02, 0.04], **{"mlfq.alpha": 50.0})
        assert cfg["sched"]["policy"] == "mlfq"
        assert ["mlfq.alpha", 50.0] in cfg["sched"]["policy_settings"]
        ids = c.inject(burst=(5, 8, 20))
        assert len(ids) == 5
        listed = {j.job_id: j for j in c.jobs()}
        some = next(i for i in ids if i in listed)
        info = c.job(some)
        assert info.tags == ["injected"] and info.prompt_tokens == 8
        assert c.status().policy == "mlfq"
        c.retune(policy="default", quanta=None, policy_settings=None)
    snap = wait_idle(daemon)
    assert snap.kv.device_used == 0


def _load_worker(endpoint: str, n: int, seed: int, results: mp.Queue) -> None:
    done = 0
    reasons: dict[str, int] = {}
    # a ping every 0.5 s: the daemon's client_timeout is 2 s, and on a loaded machine
    # the last results may come later than that after the last submit
    with Client(endpoint, timeout=60.0, heartbeat=0.5) as c:
        handles = [
            c.submit([(seed * 31 + i) % 250 + 1, 7, 9], max_tokens=3, ignore_eos=True)
            for i in range(n)
        ]
        for h in handles:
            r = h.result(timeout=300)
            reasons[r.finish_reason] = reasons.get(r.finish_reason, 0) + 1
            done += 1
    results.put((done, reasons))


@pytest.mark.slow
def test_a_thousand_requests_from_ten_processes_all_end_and_free_the_pools(daemon):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_load_worker, args=(daemon.endpoint, 100, k, results)) for k in range(10)
    ]
    for p in procs:
        p.start()
    totals = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sum(d for d, _ in totals) == 1000
    assert all(set(r) == {"length"} for _, r in totals), (totals, daemon.log.read_text()[-4000:])
    snap = wait_idle(daemon)
    assert snap.kv.device_used == 0 and snap.kv.host_used == 0
    assert snap.slo.finished > 0
