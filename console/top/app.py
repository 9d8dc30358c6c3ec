"""`fsctl top`: the Textual operator console.

A thread worker runs the `TelemetryFeed` (receive, decode, fold into `TopState`)
and posts `TelemetryUpdated` views; consecutive ones coalesce in the message queue,
so a busy UI only ever renders the latest. Control actions (abort, retune, inject)
go through one `AsyncClient` on the UI's event loop and show the daemon's answer.

Roles: the console asks the daemon (`Status`) which role its requests have and shows
it in the title; with the client role retune and inject are refused up front, with
what to do about it, rather than sent for the daemon's "forbidden".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from fsd import protocol as P
from fsd.console.cli_format import SECONDS_KEYS, find_setting, injected_summary
from fsd.console.top import forms, panels, render
from fsd.console.top.data import TopState, TopView
from fsd.console.top.dialogs import Forbidden, InjectScreen, RetuneScreen, forbidden
from fsd.console.top.jobtable import JobTable
from fsd.console.top.screens import ConfirmScreen, HelpScreen, JobDetailScreen
from fsd.console.top.source import Source, TelemetryFeed
from fsd.errors import FsdError
from fsd.kv.registry import KV_POLICIES
from fsd.sched.registry import POLICIES

NARROW = 120  # terminals narrower than this show the compact layout


class TelemetryUpdated(Message):
    """A new view to render; a newer one queued behind it replaces it."""

    def __init__(self, view: TopView) -> None:
        super().__init__()
        self.view = view

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TelemetryUpdated)


class FeedStatus(Message):
    """The telemetry connection's state in words ('' when all is well)."""

    def __init__(self, text: str, ok: bool) -> None:
        super().__init__()
        self.text = text
        self.ok = ok


@dataclass(frozen=True)
class ControlTarget:
    """Where control requests go (the daemon's request socket)."""

    endpoint: str
    timeout: float = 10.0
    curve: Any = None  # fsd.client.CurveKeys | None
    token: str | None = None  # the operator token; None: the client role


class TopApp(App[None]):
    """The operator console: panels, the job table, and levers on the daemon."""

    CSS_PATH = "top.tcss"
    TITLE = "fsd top"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark,f1", "help", "help"),
        Binding("t", "retune", "retune"),
        Binding("i", "inject", "inject"),
        Binding("a,delete", "abort", "abort"),
        Binding("p", "pause", "pause"),
        Binding("c", "toggle_config", "config"),
    ]

    def __init__(
        self,
        source: Source | None = None,
        control: ControlTarget | None = None,
        *,
        state: TopState | None = None,
        label: str | None = None,
        hz: float = 4.0,
        silence: float = 3.0,
        scenario_dir: Path = Path("scenarios"),
    ) -> None:
        super().__init__()
        self.source = source
        self.control = control
        self.state = state or TopState()
        self.hz = hz
        self.silence = silence
        self.scenario_dir = scenario_dir
        self.label = label or (source.label if source else "offline")
        self.view = self.state.view()
        self.paused = False
        self.feed: TelemetryFeed | None = None
        self._client: Any = None  # fsd.client.AsyncClient, made on first use
        self.role: str | None = None  # the daemon's answer: "operator" | "client"; None: not yet
        self._asking_role = False
        self.error: FsdError | None = None  # what stopped the feed (a bad recording line)

    # ---- layout --------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield panels.TitleBar(self.label, id="title")
        with Horizontal(id="panels"):
            yield panels.levels()
            yield panels.kv()
            yield panels.iterations()
            yield panels.slo()
        yield panels.LearnedLine(id="learned")
        yield panels.Summary(id="summary")
        with Horizontal(id="middle"):
            yield JobTable(id="jobs")
            yield panels.replicas()
            yield panels.config()
        yield Static(id="message")
        yield Footer()

    def on_mount(self) -> None:
        self._main.query_one(JobTable).focus()
        self._layout(self.size.width)
        self.render_view(self.view)
        if self.source is not None:
            self.feed = TelemetryFeed(
                self.source,
                self.state,
                lambda v: self.post_message(TelemetryUpdated(v)),
                lambda text, ok: self.post_message(FeedStatus(text, ok)),
                hz=self.hz,
                silence=self.silence,
            )
            self._run_feed()
        self._ask_role()

    def on_resize(self, event: Any) -> None:
        self._layout(event.size.width)
        self.render_view(self.view)

    def _layout(self, width: int) -> None:
        self._main.set_class(width < NARROW, "-narrow")

    @work(thread=True, exclusive=True, name="telemetry")
    def _run_feed(self) -> None:
        worker = get_current_worker()
        assert self.feed is not None
        try:
            self.feed.run(lambda: worker.is_cancelled)
        except FsdError as exc:  # a bad line further into a recording: close, `run` says it
            self.call_from_thread(self._stop, exc)
        finally:
            self.feed.source.close()

    def _stop(self, error: FsdError) -> None:
        """Close the console because of `error` (exit status 2 once `run` raises it)."""
        self.error = error
        self.exit(return_code=2)

    # ---- rendering -----------------------------------------------------------------

    @property
    def _main(self) -> Screen:
        """The console's own screen. `App.query_one` searches the active screen, which
        is a dialog while one is open; telemetry keeps updating the panels under it."""
        return self.screen_stack[0]

    def render_view(self, view: TopView) -> None:
        """Show `view` in every panel (the frame the bench times)."""
        self.view = view
        row = self._main.query("#panels")
        if not row:
            return  # the console's screen is gone (a message that arrived while closing)
        s = view.snapshot
        if s is not None:  # the panel row fits the levels, whatever their number
            row.first().styles.height = max(len(s.levels), 6) + 2
            self._main.query_one("#replicas").display = bool(s.replicas)
        self._main.query_one(panels.TitleBar).show(view)
        for panel in self._main.query(panels.Panel):
            panel.show(view)
        self._main.query_one(panels.Summary).show(view)
        self._main.query_one(panels.LearnedLine).show(view)
        self._main.query_one(JobTable).show(view)
        if isinstance(self.screen, JobDetailScreen):
            self.screen.update_data()

    def on_telemetry_updated(self, message: TelemetryUpdated) -> None:
        # once shutdown starts (is_running False) the screens are being torn down
        # widget by widget; a frame that lands then is dropped
        if self.is_running and not self.paused:
            self.render_view(message.view)

    def on_feed_status(self, message: FeedStatus) -> None:
        bar = self._main.query(panels.TitleBar)
        if not self.is_running or not bar:
            return  # closing: the console's screen is gone
        title = bar.first()
        title.status = message.text
        title.show()
        if message.ok:  # the daemon is there: learn the role if it was not answered yet
            self._ask_role()

    def say(self, text: str, error: bool = False) -> None:
        """The message line under the table: the last action's outcome."""
        line = self._main.query_one("#message", Static)
        line.set_class(error, "error")
        line.update(text)

    # ---- actions -------------------------------------------------------------------

    def action_help(self) -> None:
        sections = [
            ("console", self.BINDINGS),
            ("job table", JobTable.BINDINGS),
            ("job detail", JobDetailScreen.BINDINGS),
            ("dialogs", [*RetuneScreen.BINDINGS, Binding("enter", "", "apply / inject burst")]),
        ]
        self.push_screen(HelpScreen(sections))

    def action_pause(self) -> None:
        self.paused = not self.paused
        if self.feed is not None:
            self.feed.paused = self.paused
        title = self._main.query_one(panels.TitleBar)
        title.paused = self.paused
        title.show()
        if not self.paused:
            self.render_view(self.state.view())

    def action_toggle_config(self) -> None:
        config = self._main.query_one("#config")
        config.display = not config.display
        self.render_view(self.view)

    def on_job_table_opened(self, message: JobTable.Opened) -> None:
        self.push_screen(JobDetailScreen(message.job_id, self.state.job_history))

    def action_abort(self, job_id: str | None = None) -> None:
        job_id = job_id or self._main.query_one(JobTable).selected_job
        if job_id is None:
            self.say("no job selected", error=True)
            return
        if self._no_control():
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._abort(job_id), group="control")

        self.push_screen(ConfirmScreen(f"Abort {job_id}?"), answered)

    async def _abort(self, job_id: str) -> None:
        try:
            detail = await self._daemon().abort(job_id)
        except FsdError as exc:
            hint = ""
            if forbidden(exc):  # another client's job (the console submits none itself)
                self.show_role("client")
                hint = f"; {render.ROLE_HINT}"
            self.say(f"abort {job_id}: {exc}{hint}", error=True)
            return
        self.say(f"aborted {job_id} after {detail.get('tokens', '?')} tokens")

    def action_retune(self) -> None:
        if self._no_control() or self._read_only("retune"):
            return
        config = self.view.snapshot.config if self.view.snapshot is not None else {}
        dialog = RetuneScreen(forms.RetuneForm.from_config(config), self._retune, POLICIES, KV_POLICIES, self._preview)  # fmt: skip
        self.push_screen(dialog, self._answered)

    async def _preview(self, changes: dict[str, Any]) -> P.PreviewReply:
        return await self._daemon().preview(**changes)

    async def _retune(self, changes: dict[str, Any]) -> str:
        config = await self._daemon().retune(**changes)
        shown = []
        for key, requested in changes.items():
            found, value = find_setting(config, key)
            value = value if found else requested
            if isinstance(value, list | tuple):
                value = ",".join(forms.fmt_seconds(v) for v in value)
            elif isinstance(value, float):
                value = forms.fmt_seconds(value) if key in SECONDS_KEYS else f"{value:g}"
            shown.append(f"{key}={value}")
        return "retuned: " + " ".join(shown)

    def action_inject(self) -> None:
        if self._no_control() or self._read_only("inject"):
            return
        files = sorted(self.scenario_dir.glob("*.toml")) if self.scenario_dir.is_dir() else []
        self.push_screen(InjectScreen(files, self.scenario_dir, self._inject), self._answered)

    async def _inject(self, burst: P.Burst | None, scenario: Path | None, tag: str) -> str:
        self.state.add_inject_tag(tag)
        client = self._daemon()
        if scenario is not None:  # read here with its traces and sent inline
            ids = await client.inject(scenario=scenario, tag=tag)
        else:
            ids = await client.inject(burst=burst, tag=tag)
        # the jobs are this console's connection's: they run while it stays open
        return injected_summary(ids, tag, show=3)

    def _answered(self, answer: str | None) -> None:
        if answer:
            self.say(answer)
            self.notify(answer, timeout=4)

    # ---- the daemon ----------------------------------------------------------------

    def _no_control(self) -> bool:
        if self.control is None:
            self.say("not connected to a daemon (replay): nothing to control", error=True)
            return True
        return False

    def _read_only(self, what: str) -> bool:
        """Refuse `what` when the daemon said this console has the client role."""
        if self.role is None or self.role == "operator":
            return False  # unknown: let the daemon decide (a refusal says why)
        self.say(f"{what}: {render.ROLE_HINT}", error=True)
        return True

    def _ask_role(self) -> None:
        """Ask the daemon for this console's role, once it answers (a background call)."""
        if self.control is None or self.role is not None or self._asking_role:
            return
        self._asking_role = True
        # the title's role is a courtesy (the daemon enforces roles): no failure of the
        # call may close the console
        self.run_worker(self._fetch_role(), group="role", exit_on_error=False)

    async def _fetch_role(self) -> None:
        try:
            status = await self._daemon().status()
        except FsdError:
            return  # no daemon yet: asked again when its telemetry arrives
        finally:
            self._asking_role = False
        self.show_role(status.role)

    def show_role(self, role: str) -> None:
        """Show `role` in the title; the client role also says what it cannot do."""
        known = self.role
        self.role = role
        bar = self._main.query(panels.TitleBar)
        if not self.is_running or not bar:
            return
        title = bar.first()
        title.role = role
        title.show()
        if role != "operator" and known != role:
            self.say(render.ROLE_HINT)

    def on_forbidden(self, message: Forbidden) -> None:
        """A dialog's request was refused for its role: the role is the client's."""
        self.show_role("client")

    def _daemon(self) -> Any:
        if self._client is None:
            from fsd.client import AsyncClient

            c = self.control
            assert c is not None
            self._client = AsyncClient(c.endpoint, timeout=c.timeout, curve=c.curve, token=c.token)
        return self._client

    async def on_unmount(self) -> None:
        if self._client is not None:
            await self._client.close()
