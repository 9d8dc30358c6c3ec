"""The console shows a chunked prefill's progress: the PREFILL column and the job screen."""

from __future__ import annotations

from rich.console import Console

from fsd import protocol as P
from fsd.console import cli_format as fmt
from fsd.console.top.app import TopApp
from fsd.console.top.data import fold, sort_rows
from fsd.console.top.jobtable import JobTable
from fsd.console.top.once import print_once
from fsd.console.top.screens import JobDetailScreen
from tests.console.cells import column_cells
from tests.console.test_top_app import sync, text_of
from tests.console.test_top_data import job, snap


def prefill_job(jid: str, prefilled: int | None, prompt: int = 2048, **kw) -> P.JobInfo:
    j = job(jid, **kw)
    j.prompt_tokens, j.prefilled = prompt, prefilled
    return j


JOBS = [
    prefill_job("part", 512, state="preempted"),  # between two chunks
    prefill_job("done", 2048, state="running", out=7),
    prefill_job("fresh", 0),  # not started (or its KV was dropped)
    prefill_job("old", None),  # from a daemon that does not report it
]


@sync
async def test_the_job_table_shows_the_progress_of_a_partly_prefilled_job():
    state = fold([snap(1.0, [[j.job_id for j in JOBS]], JOBS)])
    app = TopApp(None, None, state=state)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.query_one(JobTable)
        await pilot.pause()
        cells = column_cells(table, "PREFILL")
        assert cells[""].strip() == "PREFILL" and cells["part"].strip() == "512/2048"
        for jid in ("done", "fresh", "old"):  # blank unless part done
            assert cells[jid].strip() == ""
        table.sort_by("prefill")  # the job nearest its first token first
        assert table.rows[0].job_id == "part"
        table.action_jump(0)
        await pilot.press("enter")
        assert isinstance(app.screen, JobDetailScreen) and app.screen.job_id == "part"
        detail = text_of(app.screen.query_one("#detail-info")).splitlines()
        assert fmt.detail_line("prefill", "512/2048 tokens (25%)") in detail


def test_once_and_the_progress_text():
    view = fold([snap(1.0, [[j.job_id for j in JOBS]], JOBS)]).view()
    console = Console(width=160, record=True)
    print_once(view, "test", console, sort="prefill")
    out = console.export_text()
    assert "PREFILL" in out and "512/2048" in out
    assert [r.job_id for r in sort_rows(view.rows, "prefill")][0] == "part"
    # long prompts read in thousands, never as done before they are
    assert fmt.prefill_progress(65_536, 131_072) == "65536/131k"
    assert fmt.prefill_progress(130_999, 131_072) == "130k/131k"
    assert fmt.prefill_progress(0, 8) == fmt.prefill_progress(8, 8) == ""
    assert fmt.prefill_detail(2047, 2048) == "2047/2048 tokens (99%)"
