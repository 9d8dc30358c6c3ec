"""The retune and inject dialogs: validated forms whose daemon answer they show.

A bad field is named in the dialog (and focused) before anything is sent; the
daemon's refusal is shown in the dialog, which stays open to fix it. On success
the dialog closes with the daemon's answer as its result. The retune dialog can
also ask for a preview (the daemon's twin run under the current and the proposed
settings, nothing applied), shown in the dialog until Apply or Cancel.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from fsd import protocol as P
from fsd.cli_options import default_of
from fsd.console.preview_format import preview_lines
from fsd.console.top import forms
from fsd.console.top.render import ROLE_HINT
from fsd.errors import ForbiddenError, FsdError

RetuneSend = Callable[[dict], Awaitable[str]]
PreviewSend = Callable[[dict], Awaitable[P.PreviewReply]]
InjectSend = Callable[[P.Burst | None, Path | None, str], Awaitable[str]]


def forbidden(exc: FsdError) -> bool:
    """Whether the daemon refused a request for its role (Error code "forbidden")."""
    return isinstance(exc, ForbiddenError) or getattr(exc, "code", None) == "forbidden"


class Forbidden(Message):
    """Posted to the app when the daemon refused a dialog's request for its role."""


# the retune dialog's rows besides a preview: border, title, form, error, answer, buttons
PREVIEW_SPARE_ROWS = 18
REFUSED = object()  # what `_Dialog._ask` returns once the daemon's refusal is shown


def previewing(elapsed: float) -> str:
    """The answer line while a preview runs: what runs, and for how long so far."""
    horizon, seeds = default_of(P.Preview, "horizon"), default_of(P.Preview, "seeds")
    return (
        f"previewing… {elapsed:.0f} s so far (the twin runs both settings for {horizon:g} s "
        f"of simulated time, {seeds} seeds each)"
    )


class _Dialog(ModalScreen[str | None]):
    """Shared: error / answer lines and sending through the daemon."""

    BINDINGS = [Binding("escape", "dismiss(None)", "cancel")]
    FIELDS: dict[str, str] = {}  # FormError.field → widget id

    def show_error(self, message: str) -> None:
        self.query_one("#answer", Static).update("")
        self.query_one("#error", Static).update(message)

    def fail(self, exc: forms.FormError) -> None:
        self.show_error(str(exc))
        widget_id = self.FIELDS.get(exc.field)
        if widget_id is not None:
            self.query_one(f"#{widget_id}").focus()

    async def _ask(self, request: Awaitable[Any], waiting: str) -> Any:
        """The daemon's answer to `request`, or REFUSED once its refusal is shown."""
        self.query_one("#error", Static).update("")
        self.query_one("#answer", Static).update(waiting)
        try:
            return await request
        except FsdError as exc:
            if forbidden(exc):  # say what would make it work, and show the role
                self.app.post_message(Forbidden())
                self.show_error(f"daemon: {exc}\n{ROLE_HINT}")
            else:
                self.show_error(f"daemon: {exc}")
            return REFUSED

    async def _send(self, request: Awaitable[str]) -> None:
        answer = await self._ask(request, "sending...")
        if answer is not REFUSED:
            self.dismiss(answer)

    def text(self, widget_id: str) -> str:
        return self.query_one(f"#{widget_id}", Input).value


# A Select with nothing chosen: Select.NULL since Textual 1.0, Select.BLANK before (on
# Textual 1.0+ `Select.BLANK` is Widget.BLANK, False, which Select refuses as a value)
NO_CHOICE = Select.NULL if hasattr(Select, "NULL") else Select.BLANK


def _select(widget_id: str, choices: Sequence[str], value: str) -> Select[str]:
    options = list(choices) if value in choices or not value else [value, *choices]
    return Select([(c, c) for c in options], value=value or NO_CHOICE, id=widget_id, allow_blank=not value, compact=True)  # fmt: skip


class RetuneScreen(_Dialog):
    """Quanta (explicit, or q1 × ratio), α, K, K', admission share, policy and KV policy;
    Preview shows what the change would do before Apply (when `preview` is given)."""

    BINDINGS = [*_Dialog.BINDINGS, Binding("ctrl+s", "apply", "apply"), Binding("ctrl+p", "preview", "preview")]  # fmt: skip
    FIELDS = {"quanta": "quanta", "q1": "q1", "ratio": "ratio", "alpha": "alpha", "K": "k", "K'": "k_prime", "admit": "admit"}  # fmt: skip

    def __init__(self, current: forms.RetuneForm, send: RetuneSend, policies: Sequence[str], kv_policies: Sequence[str], preview: PreviewSend | None = None) -> None:  # fmt: skip
        super().__init__()
        self.current = current
        self._send_changes = send
        self._send_preview = preview
        self.previewing = False  # a preview is on its way (one at a time: the daemon's rule)
        self.policies = policies
        self.kv_policies = kv_policies

    def compose(self) -> ComposeResult:
        c = self.current
        with Vertical(id="retune", classes="dialog"):
            yield Label("Retune the scheduler (durations: 0.01, 10ms, 250us)", classes="dialog-title")  # fmt: skip
            with Grid(classes="form"):
                yield Label("quanta from")
                yield Select([("q1 × ratio", "ratio"), ("explicit list", "quanta")], value=c.mode, id="mode", allow_blank=False, compact=True)  # fmt: skip
                yield Label("quanta", classes="quanta-row")
                yield Input(
                    c.quanta,
                    id="quanta",
                    classes="quanta-row",
                    placeholder="2ms,4ms,8ms",
                    compact=True,
                )
                yield Label("q1", classes="ratio-row")
                yield Input(
                    c.q1, id="q1", classes="ratio-row", placeholder="profile default", compact=True
                )
                yield Label("ratio", classes="ratio-row")
                yield Input(c.ratio, id="ratio", classes="ratio-row", compact=True)
                yield Label("α (SLOs)")
                yield Input(c.alpha, id="alpha", placeholder="the policy's", compact=True)
                yield Label("K (min jobs)")
                yield Input(c.k, id="k", type="integer", compact=True)
                yield Label("K' (top levels)")
                yield Input(c.k_prime, id="k_prime", type="integer", compact=True)
                yield Label("admit (KV share)")
                yield Input(c.admit, id="admit", compact=True)
                yield Label("policy")
                yield _select("policy", self.policies, c.policy)
                yield Label("KV policy")
                yield _select("kv_policy", self.kv_policies, c.kv_policy)
            yield Static(id="error", classes="error")
            yield Static(id="answer", classes="answer")
            with VerticalScroll(id="preview-box"):
                yield Static(id="preview")
            with Horizontal(classes="buttons"):
                yield Button("Apply (ctrl+s)", id="apply", variant="primary")
                if self._send_preview is not None:
                    yield Button("Preview (ctrl+p)", id="preview-button")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self._show_mode(self.current.mode)
        self.query_one("#preview-box").display = False

    def _show_mode(self, mode: str) -> None:
        for widget in self.query(".quanta-row"):
            widget.display = mode == "quanta"
        for widget in self.query(".ratio-row"):
            widget.display = mode == "ratio"

    @on(Select.Changed, "#mode")
    def _mode_changed(self, event: Select.Changed) -> None:
        self._show_mode(str(event.value))

    def form(self) -> forms.RetuneForm:
        def choice(widget_id: str) -> str:
            value = self.query_one(f"#{widget_id}", Select).value
            return "" if value is NO_CHOICE else str(value)

        return forms.RetuneForm(
            mode=choice("mode"),
            quanta=self.text("quanta"),
            q1=self.text("q1"),
            ratio=self.text("ratio"),
            alpha=self.text("alpha"),
            k=self.text("k"),
            k_prime=self.text("k_prime"),
            admit=self.text("admit"),
            policy=choice("policy"),
            kv_policy=choice("kv_policy"),
        )

    def action_apply(self) -> None:
        try:
            changes = forms.retune_changes(self.form(), self.current)
        except forms.FormError as exc:
            self.fail(exc)
            return
        self.run_worker(self._send(self._send_changes(changes)), exclusive=True)

    def action_preview(self) -> None:
        if self._send_preview is None or self.previewing:
            return
        try:
            changes = forms.retune_changes(self.form(), self.current)
        except forms.FormError as exc:
            self.fail(exc)
            return
        self.previewing = True
        self.query_one("#preview-box").display = False  # an older preview would mislead
        self.run_worker(self._preview(self._send_preview(changes)), group="preview")

    async def _preview(self, request: Awaitable[P.PreviewReply]) -> None:
        started = time.monotonic()

        def tick() -> None:  # a preview takes up to a minute: show that it goes on
            self.query_one("#answer", Static).update(previewing(time.monotonic() - started))

        timer = self.set_interval(1.0, tick)
        try:
            reply = await self._ask(request, previewing(0.0))
        finally:
            timer.stop()
            self.previewing = False
        if reply is REFUSED:
            return
        self.query_one("#answer", Static).update("")
        # Text, not markup: the spreads' [lo–hi] would read as markup tags
        self.query_one("#preview", Static).update(Text("\n".join(preview_lines(reply))))
        box = self.query_one("#preview-box", VerticalScroll)
        box.display = True
        self._fit_preview()
        box.scroll_home(animate=False)

    def _fit_preview(self) -> None:
        """The preview gets the rows the rest of the dialog leaves on the screen."""
        rows = max(3, self.app.size.height - PREVIEW_SPARE_ROWS)
        self.query_one("#preview-box").styles.max_height = rows

    def on_resize(self) -> None:
        self._fit_preview()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        elif event.button.id == "preview-button":
            self.action_preview()
        else:
            self.dismiss(None)


class InjectScreen(_Dialog):
    """Inject a scenario file from scenarios/ or a quick burst of tagged jobs."""

    FIELDS = {"count": "count", "input tokens": "input_len", "output tokens": "output_len", "tag": "tag"}  # fmt: skip

    def __init__(self, scenarios: Sequence[Path], scenario_dir: Path, send: InjectSend) -> None:
        super().__init__()
        self.scenarios = list(scenarios)
        self.scenario_dir = scenario_dir
        self._send_inject = send

    def compose(self) -> ComposeResult:
        with Vertical(id="inject", classes="dialog"):
            yield Label("Inject jobs", classes="dialog-title")
            yield Label("scenario file", classes="section")
            if self.scenarios:
                options = [(p.name, str(p)) for p in self.scenarios]
                yield Select(options, id="scenario", allow_blank=False, value=str(self.scenarios[0]), compact=True)  # fmt: skip
                yield Button("Inject scenario", id="inject-scenario")
            else:
                yield Label(f"no *.toml files in {self.scenario_dir}", classes="dim")
            yield Label("quick burst", classes="section")
            with Grid(classes="form"):
                yield Label("jobs")
                yield Input("8", id="count", type="integer", compact=True)
                yield Label("input tokens")
                yield Input("64", id="input_len", type="integer", compact=True)
                yield Label("output tokens")
                yield Input("32", id="output_len", type="integer", compact=True)
                yield Label("tag")
                yield Input("injected", id="tag", compact=True)
            yield Static(id="error", classes="error")
            yield Static(id="answer", classes="answer")
            with Horizontal(classes="buttons"):
                yield Button("Inject burst", id="inject-burst", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def action_burst(self) -> None:
        try:
            burst = forms.burst(self.text("count"), self.text("input_len"), self.text("output_len"))
            tag = forms.tag(self.text("tag"))
        except forms.FormError as exc:
            self.fail(exc)
            return
        self.run_worker(self._send(self._send_inject(burst, None, tag)), exclusive=True)

    def action_scenario(self) -> None:
        try:
            tag = forms.tag(self.text("tag"))
        except forms.FormError as exc:
            self.fail(exc)
            return
        path = Path(str(self.query_one("#scenario", Select).value))
        self.run_worker(self._send(self._send_inject(None, path, tag)), exclusive=True)

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_burst()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "inject-burst":
            self.action_burst()
        elif event.button.id == "inject-scenario":
            self.action_scenario()
        else:
            self.dismiss(None)
