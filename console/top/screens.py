"""Modal screens: job detail, abort confirmation, help."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from fsd.console.cli_format import detail_line, duration, job_lines, level_name
from fsd.console.top.data import JobHistory
from fsd.console.top.render import sparkline


def history_table(h: JobHistory) -> Table:
    """State and level changes, timed from the job's arrival (or the first sighting)."""
    t0 = h.info.arrival if h.info is not None else (h.transitions[0].time if h.transitions else 0.0)
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("AT", "STATE", "LEVEL", "SEEN BY"):
        table.add_column(name, justify="right" if name == "AT" else "left", no_wrap=True)
    for tr in h.transitions:
        table.add_row(f"+{tr.time - t0:.3f}s", tr.state, level_name(tr.level), tr.cause)
    return table


def latency_text(h: JobHistory, width: int = 40) -> Text:
    lat = h.per_token_latencies()
    if not lat:
        return Text("per-token latency: no output tokens seen yet", style="dim")
    avg = sum(lat) / len(lat)
    return Text.assemble(
        ("per-token latency ", "bold"),
        (sparkline(lat, min(width, len(lat))), "green"),
        f"  last {duration(lat[-1])}  avg {duration(avg)}  max {duration(max(lat))}",
    )


class JobDetailScreen(ModalScreen[None]):
    """One job: its latest figures, state and level history, per-token latency."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "close"),
        Binding("a", "abort", "abort job"),
    ]

    def __init__(self, job_id: str, lookup: Callable[[str], JobHistory | None]) -> None:
        super().__init__()
        self.job_id = job_id
        self._lookup = lookup

    def compose(self) -> ComposeResult:
        with Vertical(id="detail", classes="dialog"):
            yield Label(f"job {self.job_id}", classes="dialog-title")
            with VerticalScroll():
                yield Static(id="detail-info")
                yield Static(id="detail-latency")
                yield Static(id="detail-history")
            with Horizontal(classes="buttons"):
                yield Button("Abort job", id="abort", variant="error")
                yield Button("Close", id="close")

    def on_mount(self) -> None:
        self.update_data()

    def update_data(self) -> None:
        """Redraw from what the console knows now (called on every telemetry view)."""
        h = self._lookup(self.job_id)
        info = self.query_one("#detail-info", Static)
        if h is None:
            info.update(Text(f"{self.job_id}: not seen in telemetry (yet)", style="dim"))
            return
        lines = job_lines(h.info) if h.info is not None else ["not in a job table yet"]
        if h.ended:
            lines.append(detail_line("ended", h.ended))
        info.update(Text("\n".join(lines)))  # as it is: a tag may hold [brackets]
        self.query_one("#detail-latency", Static).update(latency_text(h))
        self.query_one("#detail-history", Static).update(history_table(h))

    def action_abort(self) -> None:
        self.app.action_abort(self.job_id)  # type: ignore[attr-defined]

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "abort":
            self.action_abort()
        else:
            self.dismiss()


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; dismisses with the answer."""

    BINDINGS = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm", classes="dialog"):
            yield Label(self.question, classes="dialog-title")
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", id="yes", variant="error")
                yield Button("No (n)", id="no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


def key_rows(bindings: Iterable[BindingType]) -> list[tuple[str, str]]:
    rows = []
    for b in bindings:
        if isinstance(b, Binding):
            rows.append((b.key.replace(",", " / "), b.description))
        elif isinstance(b, tuple) and len(b) >= 3:
            rows.append((str(b[0]).replace(",", " / "), str(b[2])))
    return rows


class HelpScreen(ModalScreen[None]):
    """Every key of the console, by where it works."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def __init__(self, sections: list[tuple[str, Iterable[BindingType]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        table = Table(box=None, pad_edge=False, show_header=False)
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for title, bindings in self.sections:
            table.add_row(Text(title, style="bold underline"), "")
            for key, what in key_rows(bindings):
                table.add_row(key, what)
        table.add_row(Text("mouse", style="bold underline"), "")
        table.add_row("click header", "sort by that column (again: reverse)")
        table.add_row("click / double click", "select a job / open it")
        with Vertical(id="help", classes="dialog"):
            yield Label("fsd top: keys", classes="dialog-title")
            with VerticalScroll():
                yield Static(table)
            with Horizontal(classes="buttons"):
                yield Button("Close", id="close")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss()
