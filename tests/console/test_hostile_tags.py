"""A client's tags never reach an operator's terminal as control sequences or markup:
refused at ingress (`fsd.printable.check_name`), and escaped by every rendering even
when a daemon sends them anyway (`fsctl jobs`, `fsctl job`, the event lines, the
console's job table and job screen, the daemon's log)."""

from __future__ import annotations

import io
import logging
import re

import pytest
from rich.console import Console

from fsd import protocol as P
from fsd.console import cli_format as fmt
from fsd.console.top.app import TopApp
from fsd.console.top.data import fold
from fsd.console.top.jobtable import JobTable
from fsd.console.top.screens import JobDetailScreen
from fsd.errors import ConfigError
from fsd.logfile import PrintableFormatter
from fsd.printable import check_name, shown, unprintable
from fsd.server.loop.control import check_tags
from tests.console.test_top_app import sync, text_of
from tests.console.test_top_data import job, snap

HOSTILE = [
    "\x1b]0;pwned\x07",  # OSC 0: the window title
    "\x1b]52;c;Y3VybCBldmlsCg==\x07",  # OSC 52: a clipboard write
    "\x1b[2J\x1b[H",  # clear the screen
    "\x9b2J",  # the same through C1 CSI
    "line\nbreak",
    "carriage\rreturn",
    "[/]",  # rich's closing tag: MarkupError for every `fsctl jobs`
    "[bold red]loud[/]",
    "[link=file:///etc/passwd]x[/link]",
    "\u202eevil",  # a bidi override
]
OBEYED = ("\x1b]", "\x1b[2J", "\x9b", "\x07", "\r", "\u202e")  # what a terminal would act on


def _clean(out: str) -> None:
    for seq in OBEYED:
        assert seq not in out, (seq, out)


def hostile_jobs() -> list[P.JobInfo]:
    rows = []
    for i, tag in enumerate(HOSTILE):
        j = job(f"j{i}", state="running", out=3)
        j.tags = [tag, "ok"]
        rows.append(j)
    return rows


def test_every_class_is_refused_at_ingress_naming_the_character():
    for tag, named in [("a\x1bb", "U+001B ESC"), ("a\x9bb", "C1"), ("a\nb", "newline"),
                       ("a\u202eb", "bidirectional"), ("a\x7fb", "U+007F")]:  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(named)):
            check_tags(["fine", tag])
        with pytest.raises(ConfigError, match="tag 2 holds"):
            check_tags(["fine", tag])
    check_tags(["[/]", "batch-7", "名前", "émoji 🙂"])  # markup and any printable text pass
    with pytest.raises(ConfigError, match="affinity holds"):
        check_name("affinity", "user\x1b]0;x\x07")
    assert unprintable("plain words") is None


def test_fsctl_jobs_and_fsctl_job_print_the_tags_as_text():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system="truecolor")
    rows = hostile_jobs()
    console.print(fmt.jobs_table(rows))  # no MarkupError for "[/]"
    text = out.getvalue()
    _clean(text)
    assert "[/]" in text and "[bold red]loud[/]" in text and "\\u001b]0;pwned\\u0007" in text
    assert len(text.splitlines()) == len(rows) + 1  # a newline in a tag breaks no row
    for j in rows:
        lines = fmt.job_lines(j)
        _clean("\n".join(lines))
        assert len(lines) == len(fmt.job_lines(job("plain")))


def test_event_lines_and_log_lines_escape_what_a_client_wrote():
    event = P.Event(time=0.0, kind="aborted", job_id="j1", detail={"reason": HOSTILE[1]})
    _clean(fmt.event_line(event))
    record = logging.LogRecord("fsd.server", logging.INFO, __file__, 1, "tag %s", (HOSTILE[0],), None)
    line = PrintableFormatter().format(record)
    _clean(line)
    assert "\\u001b]0;pwned\\u0007" in line and "\n" not in line
    assert shown("a\nb") == "a\\nb"


@sync
async def test_the_console_draws_hostile_tags_escaped():
    rows = hostile_jobs()
    state = fold([snap(1.0, [[j.job_id for j in rows]], rows)])
    app = TopApp(None, None, state=state)
    async with app.run_test(size=(200, 48)) as pilot:
        table = app.query_one(JobTable)
        await pilot.pause()
        drawn = [table.render_line(y).text for y in range(len(table.rows) + 1)]
        _clean("\n".join(drawn))
        assert any("[/]" in line for line in drawn)
        assert not any("\n" in line for line in drawn)
        table.action_jump(0)
        await pilot.press("enter")
        assert isinstance(app.screen, JobDetailScreen)
        detail = text_of(app.screen.query_one("#detail-info"))
        _clean(detail)
