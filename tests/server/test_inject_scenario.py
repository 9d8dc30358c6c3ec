"""Inject(scenario=...) against a real daemon: jobs arrive on the scenario's clock,
tagged; retune and abort-all act; bad scenarios are refused and change nothing."""

from __future__ import annotations

import os
import time

import pytest

from fsd.client import RequestError, TelemetryClient
from fsd.errors import ConfigError
from fsd.workload.scenario import load_scenario
from fsd.workload.timeline import expand
from tests.server.daemon_proc import SMALL_SCENARIO, Daemon, daemon_fixture, pool_config

daemon = daemon_fixture(pool_config(64, 16, 20), "inject")


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
    timeline = expand(load_scenario(SMALL_SCENARIO))
    before = time.time()
    ids, events = inject_and_watch(daemon, SMALL_SCENARIO, "sc")
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
            "set: unknown setting colour; retunable: ",
        ),
        (("rate = 8.0", "rate = 8.0\n[x"), "<inline>: not valid TOML"),
    ],
)
def test_a_bad_scenario_is_refused_and_changes_nothing(daemon, change, needle):
    text = SMALL_SCENARIO.replace(*change)
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


def test_a_missing_scenario_file_is_named_by_the_client(daemon, tmp_path):
    with daemon.client() as c, pytest.raises(ConfigError, match="gone.toml' does not exist"):
        c.inject(scenario=str(tmp_path / "gone.toml"))


def _trace_scenario(trace: str) -> str:
    return (
        f'[scenario]\nname = "t"\nduration = 2.0\n[[phase]]\narrival = "trace"\ntrace = {trace!r}\n'
    )


def test_the_daemon_never_opens_a_path_a_client_names(daemon, tmp_path):
    secret = tmp_path / "secret.env"
    secret.write_text("API_TOKEN=hunter2\n")
    secret.chmod(0o600)
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)  # opening it for reading would block the daemon for good
    named = [str(secret), str(fifo), "fsd.toml", "../../etc/passwd"]
    with daemon.client() as c:
        for path in named:
            with pytest.raises(RequestError) as info:
                c.inject(scenario=_trace_scenario(path))
            assert info.value.code == "invalid"
            assert f"trace {path!r} was not sent with the scenario" in info.value.message
            assert "hunter2" not in info.value.message
        # and it still serves
        assert len(c.complete([1, 2, 3], max_tokens=2, ignore_eos=True).token_ids) == 2


def test_a_scenario_file_travels_with_its_trace(daemon, tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "mini.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,12,3\n0.2,20,2\n0.4,8,4\n"
    )
    path = tmp_path / "replay.toml"
    path.write_text(_trace_scenario("traces/mini.csv"))  # relative to the file, read here
    ids, events = inject_and_watch(daemon, str(path), "tr")
    assert len(ids) == 3 and all("finish" in events[i] for i in ids)


def test_injected_jobs_end_with_the_client_that_injected_them(daemon):
    aborted: set[str] = set()
    with TelemetryClient(daemon.telemetry, snapshots=False, events=True) as tc:
        time.sleep(0.3)  # PUB/SUB: let the subscription reach the daemon first
        with daemon.client() as c:
            ids = c.inject(burst=(3, 8, 900), tag="reap")  # far longer than this test
        # closing the client aborted them, as the daemon reaps a silent client's
        deadline = time.time() + 20
        while aborted != set(ids) and time.time() < deadline:
            e = tc.recv(timeout=0.5)
            if e is not None and e.job_id in ids and e.kind in ("abort", "finish"):
                assert e.kind == "abort", e
                aborted.add(e.job_id)
    assert aborted == set(ids)
