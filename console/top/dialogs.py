"""The retune and inject dialogs: validated forms whose daemon answer they show.

A bad field is named in the dialog (and focused) before anything is sent; the
daemon's refusal is shown in the dialog, which stays open to fix it. On success
the dialog closes with the daemon's answer as its result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from fsd import protocol as P
from fsd.console.top import forms
from fsd.console.top.render import ROLE_HINT
from fsd.errors import ForbiddenError, FsdError

RetuneSend = Callable[[dict], Awaitable[str]]
InjectSend = Callable[[P.Burst | None, Path | None, str], Awaitable[str]]


def forbidden(exc: FsdError) -> bool:
    """Whether the daemon refused a request for its role (Error code "forbidden")."""
    return isinstance(exc, ForbiddenError) or getattr(exc, "code", None) == "forbidden"


class Forbidden(Message):
    """Posted to the app when the daemon refused a dialog's request for its role."""


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

    async def _send(self, request: Awaitable[str]) -> None:
        self.query_one("#error", Static).update("")
        self.query_one("#answer", Static).update("sending...")
        try:
            answer = await request
        except FsdError as exc:
            if forbidden(exc):  # say what would make it work, and show the role
                self.app.post_message(Forbidden())
                self.show_error(f"daemon: {exc}\n{ROLE_HINT}")
            else:
                self.show_error(f"daemon: {exc}")
            return
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
    """Quanta (explicit, or q1 × ratio), α, K, K', admission share, policy and KV policy."""

    BINDINGS = [*_Dialog.BINDINGS, Binding("ctrl+s", "apply", "apply")]
    FIELDS = {"quanta": "quanta", "q1": "q1", "ratio": "ratio", "alpha": "alpha", "K": "k", "K'": "k_prime", "admit": "admit"}  # fmt: skip

    def __init__(self, current: forms.RetuneForm, send: RetuneSend, policies: Sequence[str], kv_policies: Sequence[str]) -> None:  # fmt: skip
        super().__init__()
        self.current = current
        self._send_changes = send
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
                yield Label("α (starve limit)")
                yield Input(c.alpha, id="alpha", placeholder="100 x SLO", compact=True)
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
            with Horizontal(classes="buttons"):
                yield Button("Apply (ctrl+s)", id="apply", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self._show_mode(self.current.mode)

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

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
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
