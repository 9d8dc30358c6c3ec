"""The retune dialog's Preview against the fake daemon: what it sends and shows, that it
applies nothing, and the daemon's refusals in the dialog's error line."""

from __future__ import annotations

import re
import threading
import time

from textual.widgets import Input

from fsd import protocol as P
from fsd.client import Client
from fsd.console.top.app import ControlTarget, TopApp
from fsd.console.top.dialogs import RetuneScreen
from fsd.console.top.source import LiveSource
from tests.client.fake_daemon import FakeDaemon, running
from tests.console.test_top_app import sync, text_of, wait_for


def console(fake: FakeDaemon, token: str | None = None) -> TopApp:
    control = ControlTarget(fake.endpoint, timeout=5.0, token=token)
    return TopApp(LiveSource(fake.telemetry_endpoint), control, hz=20)


async def open_retune(app: TopApp, pilot) -> RetuneScreen:
    await wait_for(pilot, lambda: app.view.snapshot is not None)
    await pilot.press("t")
    await wait_for(pilot, lambda: isinstance(app.screen, RetuneScreen))
    return app.screen  # type: ignore[return-value]


def shown(dialog: RetuneScreen, widget_id: str) -> str:
    return text_of(dialog.query_one(f"#{widget_id}"))


@sync
async def test_preview_shows_both_sides_then_apply_or_cancel():
    with running(telemetry=True) as fake:
        app = console(fake)
        async with app.run_test(size=(120, 48)) as pilot:
            dialog = await open_retune(app, pilot)
            assert dialog.query_one("#preview-button")
            # nothing changed: named in the dialog, nothing sent
            await pilot.press("ctrl+p")
            assert "nothing changed" in shown(dialog, "error")
            dialog.query_one("#policy").value = "fcfs"
            fake.hold_previews = True
            await pilot.click("#preview-button")
            await wait_for(pilot, lambda: fake.previews)
            assert re.fullmatch(  # the seconds so far, and what runs
                r"previewing… \d+ s so far \(the twin runs both settings for 60 s of "
                r"simulated time, 4 seeds each\)",
                shown(dialog, "answer"),
            )
            assert not dialog.query_one("#preview-box").display
            await pilot.press("ctrl+p")  # one at a time: not sent again meanwhile
            fake.hold_previews = False
            box = dialog.query_one("#preview-box")
            await wait_for(pilot, lambda: box.display)
            text = shown(dialog, "preview")
            assert text.startswith("preview of policy=fcfs (nothing applied")
            assert "50.0 [45.0–55.0]" in text and "-20%" in text  # [lo–hi] is not markup
            assert "  note: the fake daemon's canned preview" in text.splitlines()
            assert shown(dialog, "answer") == "" and shown(dialog, "error") == ""
            assert [m.changes for m in fake.requests(P.Preview)] == [{"policy": "fcfs"}]
            assert not fake.requests(P.Retune) and app.screen is dialog
            # Apply sends the same change as a Retune (which the fake refuses)
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: "unsupported" in shown(dialog, "error"))
            assert [m.changes for m in fake.requests(P.Retune)] == [{"policy": "fcfs"}]
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, RetuneScreen))


@sync
async def test_a_busy_daemon_and_a_bad_field_show_in_the_error_line():
    with running(telemetry=True) as fake, Client(fake.endpoint, timeout=5) as other:
        fake.hold_previews = True  # another operator's preview is running
        threading.Thread(target=other.preview, kwargs={"policy": "srpt"}, daemon=True).start()
        deadline = time.monotonic() + 10
        while not fake.previews and time.monotonic() < deadline:
            time.sleep(0.01)
        app = console(fake)
        async with app.run_test(size=(120, 40)) as pilot:
            dialog = await open_retune(app, pilot)
            dialog.query_one("#ratio", Input).value = "0.5"
            await pilot.press("ctrl+p")
            assert "ratio: must be > 1" in shown(dialog, "error")
            assert app.focused is dialog.query_one("#ratio")
            dialog.query_one("#ratio", Input).value = "3"
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: "overloaded" in shown(dialog, "error"))
            assert shown(dialog, "answer") == "" and not dialog.query_one("#preview-box").display
            assert not dialog.previewing and app.screen is dialog
            fake.hold_previews = False
            await wait_for(pilot, lambda: not fake.previews)  # the other one was answered
            await pilot.press("ctrl+p")  # once the other one ended, it is answered
            await wait_for(pilot, lambda: dialog.query_one("#preview-box").display)
            assert shown(dialog, "error") == ""
            assert "quantum_ratio=3.0" in shown(dialog, "preview").splitlines()[0]


@sync
async def test_a_forbidden_preview_explains_the_role():
    with running(telemetry=True, token="s3cret") as fake:
        app = console(fake, token="s3cret")
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.role == "operator")
            dialog = await open_retune(app, pilot)
            fake.token = "rotated"
            dialog.query_one("#policy").value = "fcfs"
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: "forbidden" in shown(dialog, "error"))
            assert "retune/inject need the operator token" in shown(dialog, "error")
            await wait_for(pilot, lambda: app.role == "client")
        assert not fake.requests(P.Retune)
