"""The console shows what the scheduler learned: each job's RANK, and one line with the
live cost scale and the output lengths of finished jobs (from a fake snapshot)."""

from __future__ import annotations

from rich.console import Console

from fsd import protocol as P
from fsd.console.top import render
from fsd.console.top.app import TopApp
from fsd.console.top.data import fold
from fsd.console.top.jobtable import JobTable
from fsd.console.top.once import print_once
from fsd.console.top.panels import LearnedLine
from tests.console.cells import column_cells
from tests.console.test_top_app import sync, text_of
from tests.console.test_top_data import job, snap

LEARNED = P.LearnedInfo(
    samples=120,
    ready=True,
    mean=90.5,
    quantiles=[(0.1, 8), (0.5, 64), (0.9, 200), (0.99, 480)],
    by_prompt=[(256, 80, 48), (1024, 40, 210)],
)


def ranked(jid: str, rank: int | None, level: int = 1, state: str = "waiting") -> P.JobInfo:
    j = job(jid, level=level, state=state)
    j.rank = rank
    return j


# the running long job at Q4 is ranked first (the preemption threshold lifts it)
JOBS = [ranked("short", 2), ranked("long", 1, level=4, state="running"), ranked("old", None)]


def scene(info: P.SchedInfo | None) -> P.Snapshot:
    levels = [["short", "old"], [], [], ["long"]]
    s = snap(1.0, levels, JOBS)
    s.sched = info
    return s


@sync
async def test_the_job_table_ranks_jobs_and_a_line_shows_the_learned_state():
    info = P.SchedInfo(live_cost=12.5, live_cost_samples=340, learned=LEARNED)
    app = TopApp(None, None, state=fold([scene(info)]))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        table = app.query_one(JobTable)
        cells = column_cells(table, "RANK")
        assert cells[""].strip() == "RANK"
        assert {k: v.strip() for k, v in cells.items() if k} == {"short": "2", "long": "1", "old": "-"}  # fmt: skip
        table.sort_by("rank")  # the scheduler's own order, unranked last
        assert [r.job_id for r in table.rows] == ["long", "short", "old"]
        line = text_of(app.query_one(LearnedLine))
        assert "live cost ×12.5 of the profile (340 it)" in line
        assert "learned 120 jobs  p50 64  p90 200  p99 480" in line
        assert "p10" not in line  # the median and the tail only
        assert "by prompt ≤256:48 ≤1024:210" in line


def test_the_line_before_anything_is_learned_or_from_an_older_daemon():
    fresh = P.SchedInfo(learned=P.LearnedInfo(samples=0, ready=False))
    line = render.learned_line(fold([scene(fresh)]).view()).plain
    assert "×1 (profile, nothing measured yet)" in line and "nothing finished yet" in line
    warming = P.SchedInfo(live_cost=0.8, live_cost_samples=3, learned=P.LearnedInfo(samples=2, ready=False, quantiles=[(0.5, 9)]))  # fmt: skip
    line = render.learned_line(fold([scene(warming)]).view()).plain
    assert "×0.8" in line and "2 jobs (warming up)  p50 9" in line
    unlearned = render.learned_line(fold([scene(P.SchedInfo())]).view()).plain
    assert "this policy learns no lengths" in unlearned
    old = render.learned_line(fold([scene(None)]).view()).plain
    assert "not reported by this daemon" in old


def test_once_prints_the_rank_column_and_the_learned_line():
    info = P.SchedInfo(live_cost=3.0, live_cost_samples=10, learned=LEARNED)
    console = Console(width=160, record=True)
    print_once(fold([scene(info)]).view(), "test", console, sort="rank")
    out = console.export_text()
    assert "RANK" in out and "live cost ×3" in out and "p99 480" in out
