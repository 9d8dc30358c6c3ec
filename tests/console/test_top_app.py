"""`fsctl top` driven by Textual's Pilot: against a real daemon, a replay, and no daemon."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import zmq
from rich.text import Text
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input

from fsd import protocol as P
from fsd.client import RequestError
from fsd.console.cli_format import job_lines
from fsd.console.top.app import ControlTarget, FeedStatus, TopApp
from fsd.console.top.data import fold
from fsd.console.top.dialogs import InjectScreen, RetuneScreen
from fsd.console.top.jobtable import JobTable
from fsd.console.top.panels import TitleBar
from fsd.console.top.screens import ConfirmScreen, HelpScreen, JobDetailScreen
from fsd.console.top.source import LiveSource, ReplaySource
from tests.client.fake_daemon import running
from tests.console.conftest import RECORDING
from tests.server.daemon_proc import SMALL_POOL, Daemon, daemon_fixture, free_port

CONFIG = SMALL_POOL


daemon = daemon_fixture(CONFIG, "top-daemon")


def live_app(d: Daemon, scenario_dir=None) -> TopApp:
    """The console on `d` with its operator token (retune and inject need the role)."""
    kw = {} if scenario_dir is None else {"scenario_dir": scenario_dir}
    control = ControlTarget(d.endpoint, timeout=5.0, token=d.token)
    return TopApp(LiveSource(d.telemetry), control, hz=20, **kw)


async def wait_for(pilot: Pilot, cond: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("the console did not get there in time")
        await pilot.pause(0.05)


def sync(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on a fresh event loop (no pytest asyncio plugin needed)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def text_of(widget: Widget) -> str:
    content = widget.content  # type: ignore[attr-defined]
    return content.plain if isinstance(content, Text) else str(content)


def message(app: TopApp) -> str:
    return text_of(app.query_one("#message"))


async def open_dialog(pilot: Pilot, app: TopApp, key: str, dialog: type[Screen]) -> Screen:
    """Once a snapshot is in, press `key`: the dialog it opens."""
    await wait_for(pilot, lambda: app.view.snapshot is not None)
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, dialog))
    return app.screen


def fill(dialog: Screen, **inputs: str) -> None:
    """Type each value into the dialog's Input of that id."""
    for name, value in inputs.items():
        dialog.query_one(f"#{name}", Input).value = value


@sync
async def test_retune_validates_then_changes_the_daemons_config(daemon):
    app = live_app(daemon)
    async with app.run_test(size=(120, 40)) as pilot:
        dialog = await open_dialog(pilot, app, "t", RetuneScreen)
        # a bad value is caught in the dialog: named, focused, nothing sent
        fill(dialog, ratio="0.5")
        await pilot.press("ctrl+s")
        assert "ratio: must be > 1" in text_of(dialog.query_one("#error"))
        assert app.focused is dialog.query_one("#ratio")
        # a value only the daemon refuses: its Error is shown, the dialog stays
        fill(dialog, ratio="2")
        dialog.query_one("#policy").value = "srpt"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "daemon:" in text_of(dialog.query_one("#error")))
        assert app.screen is dialog
        # a good change reaches the daemon and its answer is shown
        dialog.query_one("#policy").value = "sj-mlfq"
        fill(dialog, k_prime="3", alpha="2.5")  # the policy's own alpha, in SLOs
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, RetuneScreen))
        assert "reserve_top_levels=3" in message(app) and "sj-mlfq.alpha=2.5" in message(app)
    status = daemon.snapshot().config
    assert status["cache"]["reserve_top_levels"] == 3
    assert ["sj-mlfq.alpha", pytest.approx(2.5)] in status["sched"]["policy_settings"]


@sync
async def test_inject_creates_marked_jobs_and_a_scenario_gets_an_answer(daemon, tmp_path):
    (tmp_path / "tiny.toml").write_text("# not a valid scenario for this daemon, maybe\n")
    app = live_app(daemon, scenario_dir=tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        dialog = await open_dialog(pilot, app, "i", InjectScreen)
        fill(dialog, count="0")
        await pilot.click("#inject-burst")
        assert "count: must be in [1, 10000]" in text_of(dialog.query_one("#error"))
        fill(dialog, count="3", output_len="400", tag="pilot")
        # a Button ignores clicks for 0.2 s after a press (its "-active" effect)
        button = dialog.query_one("#inject-burst")
        await wait_for(pilot, lambda: not button.has_class("-active"))
        await pilot.click("#inject-burst")
        await wait_for(pilot, lambda: not isinstance(app.screen, InjectScreen))
        assert message(app).startswith("injected 3 jobs (tag pilot)")
        table = app.query_one(JobTable)
        await wait_for(pilot, lambda: sum(r.injected and "pilot" in r.tags for r in table.rows) == 3)  # fmt: skip
        # the scenario file is listed and sent; whatever the daemon says is shown
        dialog = await open_dialog(pilot, app, "i", InjectScreen)
        await pilot.click("#inject-scenario")
        await wait_for(
            pilot,
            lambda: (
                not isinstance(app.screen, InjectScreen)
                or text_of(dialog.query_one("#error")).startswith("daemon:")
            ),
        )


@sync
async def test_abort_ends_the_selected_job(daemon):
    # injected jobs belong to the connection that injected them: it stays open meanwhile
    with daemon.client() as owner:
        ids = owner.inject(burst=(2, 8, 900), tag="victim")
        app = live_app(daemon)
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one(JobTable)
            await wait_for(pilot, lambda: ids[0] in {r.job_id for r in table.rows})
            table.sort_by("id")
            table.action_jump(next(i for i, r in enumerate(table.rows) if r.job_id == ids[0]))
            assert table.selected_job == ids[0]
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: message(app).startswith(f"aborted {ids[0]}"))
            await wait_for(pilot, lambda: ids[0] not in {r.job_id for r in table.rows})
            assert app.state.job_history(ids[0]).ended == "aborted"
            await pilot.press("a", "y")  # the cursor is now on another job (or none)
            await wait_for(pilot, lambda: "abort" in message(app))
    with daemon.client() as c, pytest.raises(RequestError):
        c.job(ids[0])


@sync
async def test_an_absent_daemon_is_reported_and_the_console_keeps_trying(recording):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    app = TopApp(LiveSource(endpoint), ControlTarget(endpoint, timeout=1.0), silence=0.3, hz=20)
    async with app.run_test(size=(120, 30)) as pilot:
        title = app.query_one(TitleBar)
        await wait_for(pilot, lambda: "no telemetry from" in title.status)
        assert endpoint in title.status and "retrying" in title.status
        # a daemon appears on that port: the console picks it up by itself
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(endpoint)
        last = [m for m in recording if isinstance(m, P.Snapshot)][-1]
        try:  # published until the title clears: silence=0.3 s would bring it back
            for _ in range(400):
                pub.send_multipart([P.TOPIC_SNAPSHOT, P.encode(last)])
                await pilot.pause(0.05)
                if app.view.snapshot is not None and title.status == "":
                    break
        finally:
            pub.close()
        assert app.view.snapshot == last
        assert title.status == ""


@sync
async def test_replay_detail_help_sort_pause_and_no_control(recording):
    app = TopApp(ReplaySource(RECORDING, speed=0), None, hz=50)
    async with app.run_test(size=(160, 48)) as pilot:
        title = app.query_one(TitleBar)
        await wait_for(pilot, lambda: title.status.startswith("replay finished"))
        assert app.view.frames == len(recording)
        table = app.query_one(JobTable)
        assert table.sort_key == "enst" and table.rows
        await pilot.press("s")  # the next column: output tokens
        assert table.sort_key == "tokens"
        ordered = [r.output_tokens for r in table.rows]
        assert ordered == sorted(ordered)
        await pilot.click(JobTable, offset=(2 + 13, 1))  # the LVL header (after a border)
        assert table.sort_key == "level"
        await pilot.click(JobTable, offset=(2 + 13, 1))
        assert table.reverse
        job_id = table.selected_job
        await pilot.press("enter")
        assert isinstance(app.screen, JobDetailScreen) and app.screen.job_id == job_id
        history = text_of(app.screen.query_one("#detail-info"))
        assert "tokens" in history and "tags" in history
        # the very lines `fsctl job` prints for it (one formatter for both)
        info = app.state.job_history(job_id).info
        assert info is not None
        assert history.splitlines()[: len(job_lines(info))] == job_lines(info)
        await pilot.press("escape", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape", "p")
        assert "PAUSED" in title.render().plain  # type: ignore[union-attr]
        await pilot.press("p", "t")
        assert "not connected to a daemon" in message(app)


@sync
async def test_views_coalesce_and_only_the_latest_is_rendered(recording):
    from fsd.console.top.app import TelemetryUpdated

    state = fold(recording[: len(recording) // 2])
    app = TopApp(None, None, state=state)
    rendered: list[int] = []
    async with app.run_test(size=(120, 40)) as pilot:
        app.render_view = lambda v, _orig=app.render_view: (rendered.append(v.frames), _orig(v))  # type: ignore[method-assign]
        views = []
        for m in recording[len(recording) // 2 :]:
            state.apply(m)
            views.append(state.view())
        for v in views:  # all queued before the app gets to run
            app.post_message(TelemetryUpdated(v))
        await pilot.pause()
        await asyncio.sleep(0)
        await pilot.pause()
    assert rendered[-1] == len(recording) and len(rendered) < len(views)


def test_once_prints_the_live_daemon(daemon):
    from typer.testing import CliRunner

    from fsd.console.cli import app as fsctl

    args = ["--endpoint", daemon.endpoint, "--telemetry-endpoint", daemon.telemetry]
    out = CliRunner().invoke(fsctl, [*args, "top", "--once"])
    assert out.exit_code == 0, out.output
    assert "MLFQ levels" in out.output and daemon.telemetry in out.output
    assert "[effective]" in out.output


@sync
async def test_a_message_that_lands_while_closing_is_dropped():
    # a worker's last view or status can arrive once the console's widgets are gone
    # (the app is closing): it must be ignored, not crash the app
    app = TopApp(None, None)
    async with app.run_test(size=(120, 40)) as pilot:
        view = app.view
        await app.screen_stack[0].query("*").remove()
        await pilot.pause()
        app.render_view(view)
        app.on_feed_status(FeedStatus("telemetry lost", ok=False))
        assert not app.screen_stack[0].query(TitleBar)


def title_of(app: TopApp) -> str:
    return app.query_one(TitleBar).render().plain  # type: ignore[union-attr]


@sync
async def test_a_console_without_the_token_shows_the_client_role_and_says_why_it_cannot_steer():
    with running(telemetry=True, token="s3cret") as fake:
        control = ControlTarget(fake.endpoint, timeout=5.0)
        app = TopApp(LiveSource(fake.telemetry_endpoint), control, hz=20)
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_for(pilot, lambda: app.role is not None)
            assert app.role == "client" and "client (read-only)" in title_of(app)
            assert "retune/inject need the operator token" in message(app)
            for key, what in (("t", "retune"), ("i", "inject")):
                await pilot.press(key)
                await pilot.pause()
                assert not isinstance(app.screen, RetuneScreen | InjectScreen)
                assert message(app).startswith(f"{what}: client role (read-only)")
        assert not fake.requests(P.Retune) and not fake.requests(P.Inject)


@sync
async def test_an_operator_console_says_so_and_a_forbidden_answer_explains_itself():
    with running(telemetry=True, token="s3cret") as fake:
        control = ControlTarget(fake.endpoint, timeout=5.0, token="s3cret")
        app = TopApp(LiveSource(fake.telemetry_endpoint), control, hz=20)
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_for(pilot, lambda: app.role is not None)
            assert app.role == "operator" and "operator" in title_of(app)
            assert "read-only" not in title_of(app)
            await wait_for(pilot, lambda: app.view.snapshot is not None)
            fake.token = "rotated"  # the daemon's token changed: it now says "forbidden"
            dialog = await open_dialog(pilot, app, "t", RetuneScreen)
            fill(dialog, ratio="3")
            await pilot.press("ctrl+s")
            error = dialog.query_one("#error")
            await wait_for(pilot, lambda: "forbidden" in text_of(error))
            assert "retune/inject need the operator token" in text_of(error)
            await wait_for(pilot, lambda: app.role == "client")
            assert "client (read-only)" in title_of(app)
