"""What the console's job table draws, cell by cell: the tests read columns by title."""

from __future__ import annotations

from fsd.console.top.jobtable import JobTable
from fsd.console.top.render import COLUMNS


def column_cells(table: JobTable, title: str) -> dict[str, str]:
    """The `title` cell of each row the widget draws, by job id (the header under '')."""
    index = [c.title for c in COLUMNS].index(title)
    left = sum(c.width + 1 for c in COLUMNS[:index])
    cells = {}
    for y in range(len(table.rows) + 1):
        text = table.render_line(y).text
        cells[text.split()[0].lstrip("◆") if y else ""] = text[left : left + COLUMNS[index].width]
    return cells
