"""The console's data layer, forms, renderers and feed: no widgets, no daemon."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from fsd import protocol as P
from fsd.console import cli_format as fmt
from fsd.console.cli import app as fsctl
from fsd.console.top import forms, render
from fsd.console.top.data import JobRow, TopState, fold, sort_rows
from fsd.console.top.source import ReplaySource, TelemetryFeed
from fsd.errors import ConfigError
from tests.console.conftest import RECORDING
from tests.wire_samples import kv_info, slo_info


def kv(out: int = 0, inn: int = 0) -> P.KVInfo:
    return kv_info(swapped_out_bytes=out, swapped_in_bytes=inn)


def slo(avg: float | None = None, p95: float | None = None, limit: float = 0.05) -> P.SLOInfo:
    figures = {"avg_per_token_latency": avg, "p95_per_token_latency": p95}
    return slo_info(**figures, slo_per_token_latency=limit)


def job(jid: str, level: int = 1, state: str = "waiting", out: int = 0, enst: float | None = 0.1, tags=()) -> P.JobInfo:  # fmt: skip
    return P.JobInfo(
        job_id=jid, state=state, level=level, kv="device", blocks=1, host_blocks=0, enst=enst,
        prompt_tokens=8, output_tokens=out, waited=0.0, attained=0.0, arrival=100.0,
        tags=list(tags),
    )  # fmt: skip


def snap(t: float, levels: list[list[str]], jobs: list[P.JobInfo] | None, **kw) -> P.Snapshot:
    return P.Snapshot(
        time=t, seq=int(t), policy="sj-mlfq",
        levels=[P.LevelInfo(index=i, quantum=0.01 * 2 ** (i - 1), job_ids=ids) for i, ids in enumerate(levels, 1)],  # fmt: skip
        jobs=jobs, jobs_time=t if jobs is not None else None, kv=kw.get("kv", kv()),
        iterations=kw.get("iterations", []), slo=kw.get("slo", slo()), config=kw.get("config", {}),
    )  # fmt: skip


# ---- data --------------------------------------------------------------------------


def test_recording_folds_into_rows_of_the_live_jobs(recording):
    view = fold(recording).view()
    last = [m for m in recording if isinstance(m, P.Snapshot)][-1]
    live = {jid for lv in last.levels for jid in lv.job_ids}
    assert view.snapshot is last and view.live_jobs == len(live) > 0
    assert {r.job_id for r in view.rows} == live
    for r in view.rows:  # only the jobs of the default inject tag are marked
        assert r.injected == ("injected" in r.tags)
    assert any(r.injected for r in view.rows) and not all(r.injected for r in view.rows)
    starts = {it.start for s in recording if isinstance(s, P.Snapshot) for it in s.iterations}
    assert len(view.iter_ms) == min(len(starts), 120)  # each iteration counted once


def test_a_snapshot_without_a_table_keeps_the_last_one_and_follows_the_levels():
    state = TopState()
    state.apply(snap(1.0, [["a", "b"], []], [job("a", 1, out=3), job("b", 1)]))
    v1 = state.view()
    state.apply(snap(2.0, [["b"], ["a", "c"]], None))  # a demoted, c new, table not sent
    v2 = state.view()
    rows = {r.job_id: r for r in v2.rows}
    assert rows["a"].level == 2 and rows["a"].output_tokens == 3 and rows["a"].in_table
    assert rows["c"].in_table is False and rows["c"].level == 2
    assert v2.rows_version != v1.rows_version and v2.jobs_time == 1.0 and v2.table_age == 1.0
    state.apply(snap(3.0, [[], ["c"]], None))  # a and b finished
    assert [r.job_id for r in state.view().rows] == ["c"]
    assert state.job_history("a").ended == "gone"


def test_swap_rates_come_from_byte_counters_between_snapshots():
    state = TopState()
    state.apply(snap(1.0, [[]], [], kv=kv(out=0, inn=0)))
    state.apply(snap(1.5, [[]], [], kv=kv(out=1000, inn=250)))
    view = state.view()
    assert view.swap_out_rate == (2000.0,) and view.swap_in_rate == (500.0,)
    assert view.device_used[-1] == pytest.approx(0.4)


def test_events_and_tables_make_a_job_history_with_per_token_latency():
    state = TopState()
    state.apply(P.Event(time=1.0, kind="arrive", job_id="a", detail={"level": 2}))
    state.apply(P.Event(time=1.1, kind="start", job_id="a", detail={"level": 2}))
    state.apply(snap(1.2, [[], ["a"]], [job("a", 2, "running", out=10)]))
    state.apply(P.Event(time=1.25, kind="demote", job_id="a", detail={"level": 3}))
    state.apply(P.Event(time=1.3, kind="preempt", job_id="a", detail={"level": 3}))
    state.apply(snap(1.7, [[], [], ["a"]], [job("a", 3, "preempted", out=15)]))
    state.apply(P.Event(time=1.9, kind="finish", job_id="a", detail={"reason": "length"}))
    h = state.job_history("a")
    assert [(t.state, t.level, t.cause) for t in h.transitions] == [
        ("waiting", 2, "arrive"),
        ("running", 2, "start"),
        ("running", 3, "demote"),
        ("preempted", 3, "preempt"),
        ("finished", 3, "finish"),
    ]
    assert h.per_token_latencies() == [pytest.approx(0.1)]  # 5 tokens in 0.5 s
    assert h.ended == "finished: length"


def test_an_end_event_that_comes_after_the_job_left_the_tables_still_says_how():
    # snapshots and events are separate topics: the abort may land after the snapshot
    # in which the job is already gone
    state = TopState()
    state.apply(snap(1.0, [["a", "b"]], [job("a"), job("b")]))
    state.apply(snap(1.1, [["b"]], [job("b")]))
    assert state.job_history("a").ended == "gone"
    state.apply(P.Event(time=1.05, kind="abort", job_id="a", detail={}))
    assert state.job_history("a").ended == "aborted"
    state.apply(snap(1.2, [[]], []))
    state.apply(P.Event(time=1.15, kind="finish", job_id="b", detail={"reason": "stop"}))
    state.apply(P.Event(time=1.3, kind="abort", job_id="b", detail={}))  # a late duplicate
    assert state.job_history("b").ended == "finished: stop"


def test_sorting_puts_unknown_enst_last_and_reverses():
    rows = [
        JobRow.of(job("a", enst=None), frozenset()),
        JobRow.of(job("b", enst=0.5), frozenset()),
        JobRow.of(job("c", enst=0.1), frozenset()),
    ]
    assert [r.job_id for r in sort_rows(rows, "enst")] == ["c", "b", "a"]
    assert [r.job_id for r in sort_rows(rows, "enst", reverse=True)] == ["a", "b", "c"]
    assert math.isinf(JobRow.pending("x", 1).arrival)


# ---- forms -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"), [("0.01", 0.01), ("10ms", 0.01), ("250us", 250e-6), (" 1.5s ", 1.5)]
)
def test_durations_accept_units(text, seconds):
    assert forms.parse_seconds("q1", text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("field", "kw", "message"),
    [
        ("quanta", {"mode": "quanta", "quanta": "4ms,2ms"}, "strictly increasing"),
        ("q1", {"q1": "fast"}, "not a duration"),
        ("ratio", {"ratio": "0.5"}, "must be > 1"),
        ("alpha", {"alpha": "-1"}, "must be > 0 SLOs, got -1"),
        ("alpha", {"alpha": "10ms"}, "'10ms' is not a number"),
        ("K", {"k": "-1"}, "must be in [0, 65536], got -1"),
        ("K", {"k": str(2**62)}, f"must be in [0, 65536], got {2**62}"),
        ("K'", {"k_prime": "257"}, "must be in [0, 256], got 257"),
        ("ratio", {"ratio": "5000"}, "must be <= 1000, got 5000"),
        ("alpha", {"alpha": "2e6"}, "must be in (0, 1e+06] SLOs, got 2000000.0"),
        ("alpha", {"alpha": "5", "policy": "fcfs"}, "policy fcfs has no alpha; clear it"),
        ("quanta", {"mode": "quanta", "quanta": "1ms,2e9"}, "must be <= 86400s (one day)"),
        ("K'", {"k_prime": "x"}, "not a whole number"),
        ("admit", {"admit": "1.5"}, "must be in (0, 1]"),
        ("admit", {"admit": "lots"}, "not a number"),
    ],
)
def test_bad_retune_fields_are_named(field, kw, message):
    current = forms.RetuneForm(q1="2ms", alpha="100", policy="fsd")
    with pytest.raises(forms.FormError) as err:
        forms.retune_changes(_replace(current, **kw), current)
    assert err.value.field == field and message in err.value.message


def test_retune_assignments_reset_to_the_default_with_none_quanta_included():
    # quanta=none puts back the levels that q1 and quantum_ratio derive
    assert fmt.parse_assignments(["quanta=none", "q1=None"]) == {"quanta": None, "q1": None}
    assert fmt.parse_assignments(["quanta=1ms,2ms"]) == {"quanta": [0.001, 0.002]}
    with pytest.raises(ConfigError, match=r"q1: must be <= 86400s \(one day\)"):
        fmt.parse_assignments(["q1=1e9"])
    # a policy's alpha is a count of SLOs: a plain number, no unit
    assert fmt.parse_assignments(["fsd.alpha=50", "mlfq.alpha=2.5"]) == {
        "fsd.alpha": 50, "mlfq.alpha": 2.5,
    }  # fmt: skip


def _replace(form: forms.RetuneForm, **kw) -> forms.RetuneForm:
    import dataclasses

    return dataclasses.replace(form, **kw)


def test_retune_sends_only_what_changed():
    config = {
        "sched": {"policy": "default", "q1": None, "quantum_ratio": 2.0, "quanta": None},
        "cache": {"kv_policy": "proactive", "reserve_min_jobs": 1, "reserve_top_levels": 1},
        "effective": {"policy": "sj-mlfq", "quanta": [0.002, 0.004], "starve_limit": 0.02},
    }
    current = forms.RetuneForm.from_config(config)
    assert current.policy == "sj-mlfq" and current.q1 == "2ms" and current.mode == "ratio"
    assert current.alpha == "1"  # sj-mlfq's own alpha, in SLOs
    with pytest.raises(forms.FormError, match="nothing changed"):
        forms.retune_changes(current, current)
    changed = _replace(current, k_prime="3", alpha="50")
    assert forms.retune_changes(changed, current) == {
        "reserve_top_levels": 3, "sj-mlfq.alpha": 50.0
    }  # fmt: skip
    # another policy keeps its own alpha unless the field is edited
    assert forms.retune_changes(_replace(current, policy="fsd"), current) == {"policy": "fsd"}
    assert forms.retune_changes(_replace(current, policy="fsd", alpha="20"), current) == {
        "policy": "fsd", "fsd.alpha": 20.0
    }  # fmt: skip
    assert forms.retune_changes(_replace(current, policy="fcfs"), current) == {"policy": "fcfs"}
    assert current.admit == "0.9"  # absent from the config: the code's default
    admit = _replace(current, admit="0.2")
    assert forms.retune_changes(admit, current) == {"admit_fraction": 0.2}
    explicit = _replace(current, mode="quanta", quanta="1ms, 3ms, 9ms")
    assert forms.retune_changes(explicit, current) == {"quanta": [0.001, 0.003, 0.009]}


def test_the_forms_alpha_is_the_running_policys_own_in_slos():
    def form(policy: str, settings: list) -> forms.RetuneForm:
        config = {"sched": {"policy": "default", "policy_settings": settings},
                  "effective": {"policy": policy, "starve_limit": 5.0}}  # fmt: skip
        return forms.RetuneForm.from_config(config)

    assert form("fsd", [["fsd.alpha", 50.0], ["mlfq.alpha", 2.0]]).alpha == "50"
    assert form("fsd", [["fsd.alpha", "7.5"]]).alpha == "7.5"  # a command line's text
    assert form("fsd", [["sj-mlfq.alpha", 3.0]]).alpha == "100"  # fsd's own default
    assert form("gittins", []).alpha == ""  # no alpha: nothing to show or send
    gittins = form("gittins", [])
    assert forms.retune_changes(_replace(gittins, k="7"), gittins) == {"reserve_min_jobs": 7}


def test_leaving_explicit_quanta_clears_them():
    current = forms.RetuneForm(mode="quanta", quanta="1ms,2ms", q1="1ms", ratio="2")
    changes = forms.retune_changes(_replace(current, mode="ratio", ratio="3"), current)
    assert changes["quanta"] is None and changes["quantum_ratio"] == 3.0


def test_burst_and_tag_validation():
    assert forms.burst("3", "16", "8") == P.Burst(count=3, input_len=16, output_len=8)
    with pytest.raises(forms.FormError, match="count"):
        forms.burst("0", "16", "8")
    with pytest.raises(forms.FormError, match="tag"):
        forms.tag("two words")


# ---- rendering ---------------------------------------------------------------------


def test_sparkline_scales_to_its_max_and_pads():
    assert render.sparkline([0, 1, 2, 4], 6) == "  ▁▃▅█"
    assert render.sparkline([], 3) == "   "
    assert render.bar(0.5, 4) == "██  " and render.bar(1.0, 3) == "███"


def test_tok_s_counts_streaming_jobs_before_any_has_finished():
    # 32 jobs stream and none has finished: the SLO window's throughput is still 0, but
    # the engine makes 32 tokens per 25 ms iteration
    none_done = slo_info(finished=0, tokens_per_s=0.0, requests_per_s=0.0)
    ids = [f"j{i}" for i in range(32)]
    state = TopState()
    for k in range(1, 4):
        t = 100.0 + 0.25 * k
        its = [
            P.IterationInfo(start=t - 0.25 + 0.025 * i, duration=0.025, batch_size=32,
                            prefill_tokens=0, decode_tokens=32)
            for i in range(10)
        ]  # fmt: skip
        jobs = [job(j, state="running", out=10 * k) for j in ids]
        state.apply(snap(t, [ids], jobs, iterations=its, slo=none_done))
    view = state.view()
    assert view.tokens_per_s == pytest.approx((1280.0,) * 3)
    assert render.iterations_panel(view).plain.splitlines()[2].endswith(" 1280.0")
    assert "tok/s     1280.0" in render.slo_panel(view).plain
    assert "tok/s=1280.0" in fmt.snapshot_line(view.snapshot)  # fsctl watch


def test_over_the_slo_is_highlighted():
    state = TopState()
    state.apply(snap(1.0, [[]], [], slo=slo(avg=0.03, p95=0.09, limit=0.05)))
    view = state.view()
    assert render.slo_over(view.snapshot.slo)
    assert "OVER SLO" in render.header_text(view, "x").plain
    panel = render.slo_panel(view)
    styled = {panel.plain[sp.start : sp.end].strip(): sp.style for sp in panel.spans}
    assert styled["30.0ms"] == render.SLO_OK and styled["90.0ms"] == render.SLO_BAD
    ok = TopState()
    ok.apply(snap(1.0, [[]], [], slo=slo(avg=0.01, p95=0.02, limit=0.05)))
    assert "OVER SLO" not in render.header_text(ok.view(), "x").plain


def test_config_keys_line_up_with_a_gap_before_every_value():
    state = TopState()
    config = {
        "sched": {"policy": "default", "q1": 2.5},
        "cache": {"gpu_memory_utilization": 0.85, "kv_policy": "proactive"},
    }
    state.apply(snap(1.0, [[]], [], config=config))
    lines = [
        ln for ln in render.config_panel(state.view()).plain.splitlines() if not ln.startswith("[")
    ]
    starts = {
        ln.index(value)
        for ln, value in zip(lines, ("default", "2.50s", "0.85", "proactive"), strict=True)
    }
    assert len(starts) == 1  # every value in one column
    assert lines[2].startswith(" gpu_memory_utilization ")


def test_the_config_panel_shows_policy_settings_as_assignments():
    state = TopState()
    config = {"sched": {"policy_settings": [["fsd.alpha", 50.0], ["fsd.demote", "always"]]}}
    state.apply(snap(1.0, [[]], [], config=config))
    assert "fsd.alpha=50 fsd.demote=always" in render.config_panel(state.view()).plain


# ---- the feed ----------------------------------------------------------------------


def test_the_feed_folds_every_frame_but_hands_over_few_views(recording):
    views, statuses = [], []
    source = ReplaySource(RECORDING, speed=0)
    feed = TelemetryFeed(
        source, TopState(), views.append, lambda t, ok: statuses.append(t), hz=1000
    )
    feed.run(lambda: False)
    assert views[-1].frames == len(recording)
    assert 1 <= len(views) < len(recording)  # coalesced: a view per period, not per frame
    assert views[-1].snapshot == fold(recording).view().snapshot
    assert statuses[-1].startswith("replay finished")


def test_the_feed_says_when_the_daemon_is_silent():
    class Silent:
        label, done = "tcp://127.0.0.1:9", False

        def recv(self, timeout):
            return None

        def pause(self):
            pass

        def resume(self):
            pass

        def close(self):
            pass

    statuses: list[str] = []
    stop = iter(range(40))
    feed = TelemetryFeed(
        Silent(), TopState(), lambda v: None, lambda t, ok: statuses.append(t), silence=0.0
    )
    feed.run(lambda: next(stop, None) is None)
    assert any("no telemetry from tcp://127.0.0.1:9" in s and "retrying" in s for s in statuses)


# ---- fsctl top --once --------------------------------------------------------------


def test_once_prints_a_replayed_snapshot(utc, recording):
    out = CliRunner().invoke(fsctl, ["top", "--once", "--replay", str(RECORDING)])
    assert out.exit_code == 0, out.output
    last = [m for m in recording if isinstance(m, P.Snapshot)][-1]
    for text in ("MLFQ levels", "KV residency", "SLO", "config", f"#{last.seq}"):
        assert text in out.output
    assert all(jid in out.output for lv in last.levels for jid in lv.job_ids)


def test_once_without_a_daemon_fails_clearly(tmp_path):
    from tests.server.daemon_proc import free_port

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    args = ["--telemetry-endpoint", endpoint, "--timeout", "0.5", "top", "--once"]
    out = CliRunner().invoke(fsctl, ["--endpoint", endpoint, *args])
    assert out.exit_code == 2  # nothing runs there: said at once, from the pidfile and socket
    assert f"no fsd daemon answered at {endpoint}: none runs there" in out.output
    missing = CliRunner().invoke(fsctl, ["top", "--replay", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "cannot open recording" in missing.output


# ---- fsctl top --replay: a bad recording ---------------------------------------------

GOOD_START = RECORDING.read_bytes().splitlines(keepends=True)[:4]


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "cannot open recording"),
        (b"", "holds no telemetry"),
        (b"\x00\xffnot a recording\n", "bad.jsonl:1: not a telemetry record"),
        # good frames, then a bad one: the console has started, closes and says why
        (b"".join(GOOD_START) + b'{"t": 1, "topic": "snapshot", "payload": {}}\n', "bad.jsonl:5"),
    ],
)
def test_replaying_a_bad_recording_is_one_error_line_and_exit_2(tmp_path, content, error):
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_bytes(content)
    cmd = [sys.executable, "-m", "fsd.console.cli", "top", "--replay", str(path), "--speed", "0"]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        cmd, cwd=root, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.count("error: ") == 1 and error in proc.stderr
