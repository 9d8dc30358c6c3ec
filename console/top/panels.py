"""The console's panels: thin Static widgets over the renderers in `render.py`."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import RenderableType
from rich.text import Text
from textual.widgets import Static

from fsd.console.top import render, render_replicas
from fsd.console.top.data import EMPTY_VIEW, TopView


class Panel(Static):
    """A bordered panel that re-renders itself from each view and on resize."""

    def __init__(
        self,
        title: str,
        draw: Callable[[TopView, int], RenderableType],
        *,
        id: str,
        key: Callable[[TopView], object] | None = None,
    ) -> None:
        super().__init__(id=id, classes="panel")
        self.border_title = title
        self._draw = draw
        self._key = key  # what the drawing depends on, when that is cheaper to compare
        self._drawn: object = None
        self._view = EMPTY_VIEW

    def show(self, view: TopView) -> None:
        self._view = view
        if not self.display:  # hidden panels cost nothing
            return
        width = self.content_size.width
        if self._key is not None:
            drawn = (self._key(view), width)
            if drawn == self._drawn:
                return
            self._drawn = drawn
        self.update(self._draw(view, width), layout=False)  # panels have fixed sizes

    def on_resize(self) -> None:
        self._drawn = None
        self.show(self._view)


def _levels(view: TopView, width: int) -> RenderableType:
    return render.levels_panel(view, bar_width=max(4, width - 18))


def _kv(view: TopView, width: int) -> RenderableType:
    return render.kv_panel(view, spark=max(4, width - 22))


def _iterations(view: TopView, width: int) -> RenderableType:
    return render.iterations_panel(view, spark=max(4, width - 16))


def _slo(view: TopView, width: int) -> RenderableType:
    return render.slo_panel(view)


def _config(view: TopView, width: int) -> RenderableType:
    return render.config_panel(view)


def _replicas(view: TopView, width: int) -> RenderableType:
    return render_replicas.replicas_panel(view)


def replicas() -> Panel:
    """Shown only for a daemon of several replicas (fsd.cluster)."""
    panel = Panel("replicas", _replicas, id="replicas")
    panel.display = False
    return panel


def levels() -> Panel:
    return Panel("MLFQ levels", _levels, id="levels")


def kv() -> Panel:
    return Panel("KV residency", _kv, id="kv")


def iterations() -> Panel:
    return Panel("iterations", _iterations, id="iterations")


def slo() -> Panel:
    return Panel("SLO", _slo, id="slo")


def config() -> Panel:
    return Panel("config", _config, id="config", key=lambda v: v.snapshot and v.snapshot.config)


class Summary(Static):
    """One line of SLO and iteration figures, for terminals too narrow for their panels."""

    def show(self, view: TopView) -> None:
        s = view.snapshot
        if s is None or not self.display:
            return
        slo = s.slo
        it = render.latest(view.iter_ms)
        parts = [
            Text("ptl ", style="bold"),
            Text(
                f"{render.duration(slo.avg_per_token_latency)} p95 {render.duration(slo.p95_per_token_latency)}",
                style=render.SLO_BAD if render.slo_over(slo) else render.SLO_OK,
            ),
            Text(f" (slo {render.duration(slo.slo_per_token_latency)})  "),
            Text("ttft ", style="bold"),
            Text(f"{render.duration(slo.avg_ttft)}  "),
            Text("tok/s ", style="bold"),
            Text(f"{render.tokens_per_s(view):.0f}  "),
            Text("iter ", style="bold"),
            Text("-" if it is None else f"{it:.1f}ms"),
        ]
        self.update(Text.assemble(*parts), layout=False)


class LearnedLine(Static):
    """One line: the live cost scale and the output lengths the scheduler learned."""

    def show(self, view: TopView) -> None:
        if view.snapshot is not None:
            self.update(render.learned_line(view), layout=False)


class TitleBar(Static):
    """The top line: source, role, policy, snapshot number and time, connection status."""

    def __init__(self, source: str, *, id: str) -> None:
        super().__init__(id=id)
        self.source = source
        self.status = ""
        self.paused = False
        self.role: str | None = None  # the daemon's answer (operator / client)
        self._view = EMPTY_VIEW

    def show(self, view: TopView | None = None) -> None:
        if view is not None:
            self._view = view
        status = ("PAUSED " if self.paused else "") + self.status
        text = render.header_text(self._view, self.source, status.strip(), self.role)
        self.update(text, layout=False)
