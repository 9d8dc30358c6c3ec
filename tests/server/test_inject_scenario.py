"""Inject(scenario=...) against a real daemon: jobs arrive on the scenario's clock,
tagged; retune and abort-all act; bad scenarios are refused and change nothing."""

from __future__ import annotations

import time

import pytest

from fsd.client import RequestError, TelemetryClient
from fsd.workload.scenario import load_scenario
from fsd.workload.timeline import expand
from tests.server.daemon_proc import Daemon, daemon_fixture

CONFIG = """
[cache]
num_gpu_blocks = 64
num_host_blocks = 256
[sched]
max_batch_size = 16
[server]
telemetry_hz = 20
"""

SMALL = """
[scenario]
name = "small"
seed = 11
duration = 1.5

[[phase]]
arrival = "poisson"
rate = 8.0
lengths = { prompt = { dist = "lognormal", mean = 20, sigma = 0.3 }, output = 6 }

[[event]]
at = 0.5
kind = "burst"
count = 3
prompt_len = 30
output_len = 4
"""


daemon = daemon_fixture(CONFIG, "inject")


def inject_and_watch(d: Daemon, spec: str, tag: str, timeout: float = 60.0):
    """Inject `spec` while subscribed to events; (job ids, {job id: {event kind: time}})
    once every injected job has finished or been aborted."""
    events: dict[str, dict[str, float]] = {}
    with TelemetryClient(d.telemetry, snapshots=False, events=True) as tc, d.client() as c:
        time.sleep(0.3)  # PUB/SUB: let the subscription reach the daemon first
        ids = c.inject(scenario=spec, tag=tag)
        listed = {j.job_id: j.tags for j in c.jobs()}
        assert all(tags == [tag] for job, tags in listed.items() if job in ids)
        ended: set[str] = set()
        deadline = time.time() + timeout
        while len(ended) < len(ids) and time.time() < deadline:
            e = tc.recv(timeout=0.5)
            if e is None or e.job_id not in ids:
                continue
            events.setdefault(e.job_id, {})[e.kind] = e.time
            if e.kind in ("finish", "abort"):
                ended.add(e.job_id)
        assert len(ended) == len(ids), f"{len(ids) - len(ended)} jobs never ended"
        while c.status().jobs and time.time() < deadline:
            time.sleep(0.1)
    return ids, events


def test_scenario_jobs_arrive_on_its_clock_tagged_and_finish(daemon):
    timeline = expand(load_scenario(SMALL))
    before = time.time()
    ids, events = inject_and_watch(daemon, SMALL, "sc")
    assert len(ids) == len(timeline.arrivals) == len(set(ids))
    assert all("finish" in events[i] and "arrive" in events[i] for i in ids)
    # each job arrived at the feed's start plus its offset in the timeline, exactly
    offsets = [a.time for a in timeline.arrivals]
    start = events[ids[0]]["arrive"] - offsets[0]
    assert start >= before - 1e-6
    assert [events[i]["arrive"] - start for i in ids] == pytest.approx(offsets, abs=1e-6)
    with daemon.client() as c:
        assert c.status().jobs == 0


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (("rate = 8.0", "rate = -1"), "<inline>: phase[0].rate: must be > 0, got -1"),
        (("output_len = 4", "output_len = 4\ncolour = 1"), "event[0].colour: unknown field"),
        (("prompt_len = 30", "prompt_len = 5000"), "burst@0.5s: job"),
        (
            (
                'kind = "burst"',
                'kind = "retune"\nset = { colour = 1 }\n[[event]]\nat = 0.1\nkind = "burst"',
            ),
            "set.colour: not a retunable setting",
        ),
        (("rate = 8.0", "rate = 8.0\n[x"), "<inline>: not valid TOML"),
    ],
)
def test_a_bad_scenario_is_refused_and_changes_nothing(daemon, change, needle):
    text = SMALL.replace(*change)
    with daemon.client() as c:
        before = c.status()
        with pytest.raises(RequestError) as info:
            c.inject(scenario=text, tag="bad")
        assert info.value.code == "invalid"
        assert needle in info.value.message
        after = c.status()
        assert after.jobs == before.jobs == 0 and after.policy == before.policy
        time.sleep(0.3)  # a refused scenario must not feed anything later either
        assert c.status().jobs == 0


def test_a_missing_scenario_file_is_named(daemon, tmp_path):
    with daemon.client() as c, pytest.raises(RequestError, match="gone.toml' does not exist"):
        c.inject(scenario=str(tmp_path / "gone.toml"))


def test_retune_and_abort_all_from_a_scenario_file(daemon, tmp_path):
    path = tmp_path / "act.toml"
    path.write_text(
        """
[scenario]
name = "act"
duration = 5.0
[[phase]]
arrival = "uniform"
rate = 0.2
lengths = { prompt = 8, output = 2 }
[[event]]
at = 0.0
kind = "burst"
count = 4
prompt_len = 16
output_len = 400
[[event]]
at = 0.2
kind = "retune"
set = { policy = "fcfs" }
[[event]]
at = 0.6
kind = "abort-all"
"""
    )
    ids, events = inject_and_watch(daemon, str(path), "act")
    burst = ids[:4]  # at 0 s, before the phase's first job (at 5 s: none)
    assert len(ids) == 4
    assert all("abort" in events[i] for i in burst)  # 400 tokens each: still running at 0.6 s
    with daemon.client() as c:
        assert c.status().policy == "fcfs"
        c.retune(policy="sj-mlfq")
