"""The job table: a virtualized Line-API widget that stays fast with 10k jobs.

Only the rows on screen are formatted on each refresh; the whole list is sorted
once per new job table or sort change, never per frame. The header line stays put
while the rows scroll; the cursor follows its job across updates.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from fsd.console.top.data import EMPTY_VIEW, JobRow, TopView, sort_rows
from fsd.console.top.render import COLUMNS, job_cells, jobs_caption
from fsd.printable import shown


class JobTable(ScrollView, can_focus=True):
    """The live jobs; Enter opens one, `s` / a header click sorts, `r` reverses."""

    BINDINGS = [
        Binding("up,k", "move(-1)", "up", show=False),
        Binding("down,j", "move(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home,g", "jump(0)", "first", show=False),
        Binding("end,G", "jump(-1)", "last", show=False),
        Binding("enter", "open", "detail"),
        Binding("s", "cycle_sort", "sort"),
        Binding("r", "reverse_sort", "reverse", show=False),
    ]
    COMPONENT_CLASSES = {"jobtable--header", "jobtable--cursor", "jobtable--stale"}

    class Opened(Message):
        """The operator asked for a job's detail (Enter or double click)."""

        def __init__(self, job_id: str) -> None:
            super().__init__()
            self.job_id = job_id

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sort_key = "enst"
        self.reverse = False
        self.cursor = 0
        self.rows: list[JobRow] = []
        self._view = EMPTY_VIEW
        self._sorted_for: tuple[int, str, bool] | None = None
        self._styles: dict[str, Style] = {}

    # ---- data ----------------------------------------------------------------------

    def show(self, view: TopView) -> None:
        """Take a new view; re-sort only if its rows or the sort order changed."""
        self._view = view
        key = (view.rows_version, self.sort_key, self.reverse)
        if key != self._sorted_for:
            selected = self.selected_job
            self.rows = sort_rows(view.rows, self.sort_key, self.reverse)
            self._sorted_for = key
            self._follow(selected)
            self.virtual_size = Size(1, len(self.rows) + 1)  # rows fit the width: no x scroll
        self.border_title = jobs_caption(view, len(self.rows), self.sort_key, self.reverse)
        self.refresh()

    def _follow(self, job_id: str | None) -> None:
        """Keep the cursor on `job_id` if it is still listed, else keep its position."""
        if job_id is not None:
            for i, r in enumerate(self.rows):
                if r.job_id == job_id:
                    self.cursor = i
                    break
        self.cursor = max(0, min(self.cursor, len(self.rows) - 1))
        self._scroll_to_cursor()

    @property
    def selected_job(self) -> str | None:
        return self.rows[self.cursor].job_id if 0 <= self.cursor < len(self.rows) else None

    def sort_by(self, key: str, reverse: bool | None = None) -> None:
        self.sort_key = key
        self.reverse = self.reverse if reverse is None else reverse
        self.show(self._view)

    # ---- rendering -----------------------------------------------------------------

    def _style(self, spec: str) -> Style:
        style = self._styles.get(spec)
        if style is None:
            style = self._styles[spec] = Style.parse(spec) if spec else Style()
        return style

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == 0:
            return self._header(width, base)
        index = self.scroll_offset.y + y - 1
        if index >= len(self.rows):
            return Strip.blank(width, base)
        row = self.rows[index]
        segments = []
        for col, (text, spec) in zip(COLUMNS, job_cells(row), strict=True):
            cell = text.rjust(col.width) if col.right else text.ljust(col.width)
            segments.append(Segment(cell[: col.width] + " ", base + self._style(spec)))
        segments.append(Segment(shown(",".join(row.tags)), base + self._style("dim")))
        strip = Strip(segments).crop_extend(0, width, base)
        if index == self.cursor:
            strip = strip.apply_style(self.get_component_rich_style("jobtable--cursor"))
        elif not row.in_table:
            strip = strip.apply_style(self.get_component_rich_style("jobtable--stale"))
        return strip

    def _header(self, width: int, base: Style) -> Strip:
        style = base + self.get_component_rich_style("jobtable--header")
        segments = []
        for col in COLUMNS:
            title = col.title
            if col.sort == self.sort_key:
                title += "▼" if self.reverse else "▲"
            cell = title.rjust(col.width) if col.right else title.ljust(col.width)
            segments.append(Segment(cell + " ", style))
        segments.append(Segment("TAGS", style))
        return Strip(segments).crop_extend(0, width, style)

    def _column_at(self, x: int) -> str | None:
        left = 0
        for col in COLUMNS:
            if left <= x < left + col.width + 1:
                return col.sort
            left += col.width + 1
        return None

    # ---- moving --------------------------------------------------------------------

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self.size.height - 1)
        top = self.scroll_offset.y
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)

    def _set_cursor(self, index: int) -> None:
        if self.rows:
            self.cursor = max(0, min(index, len(self.rows) - 1))
            self._scroll_to_cursor()
            self.refresh()

    def action_move(self, delta: int) -> None:
        self._set_cursor(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self._set_cursor(self.cursor + direction * max(1, self.size.height - 2))

    def action_jump(self, index: int) -> None:
        self._set_cursor(index if index >= 0 else len(self.rows) - 1)

    def action_open(self) -> None:
        if self.selected_job is not None:
            self.post_message(self.Opened(self.selected_job))

    def action_cycle_sort(self) -> None:
        keys = [c.sort for c in COLUMNS]
        self.sort_by(keys[(keys.index(self.sort_key) + 1) % len(keys)])

    def action_reverse_sort(self) -> None:
        self.sort_by(self.sort_key, not self.reverse)

    def on_click(self, event: events.Click) -> None:
        at = event.get_content_offset(self)
        if at is None:
            return
        if at.y == 0:
            key = self._column_at(at.x)
            if key is not None:  # a click on the sorted column flips its order
                self.sort_by(key, not self.reverse if key == self.sort_key else False)
            return
        self._set_cursor(self.scroll_offset.y + at.y - 1)
        if event.chain >= 2:
            self.action_open()

    def on_resize(self, event: events.Resize) -> None:
        self.virtual_size = Size(1, len(self.rows) + 1)
        self._scroll_to_cursor()
