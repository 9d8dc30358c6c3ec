"""One level convention at every boundary: the scheduler counts from 0, users from Q1.

A job at the top level is level 1 in `fsctl jobs --json` (job_info), in the snapshot's
levels, in telemetry events, and Q1 in `fsctl jobs` / `job` / `watch` and the console.
"""

from __future__ import annotations

import time

import pytest

from fsd import protocol as P
from fsd.config import EngineConfig
from fsd.console import cli_format as fmt
from fsd.console.top import render
from fsd.console.top.data import fold
from fsd.engine.core import Engine
from fsd.engine.face import EngineFace
from fsd.engine.views import job_info
from fsd.jobs import SamplingParams
from fsd.metrics import SLOWindow
from fsd.server.publish.telemetry import build_snapshot, wire_event
from tests.sched.harness import COST


@pytest.fixture(scope="module")
def engine():
    # explicit quanta of 10 iterations and more: a 4-token prompt joins Q1; with the
    # "always" rule (sj-mlfq's) the job drops to Q2 after its 10th iteration
    config = EngineConfig.from_kwargs(
        model="tiny", device="cpu", num_gpu_blocks=64, quanta=(10.0, 20.0, 40.0), policy="sj-mlfq"
    )
    e = Engine(config, cost=COST)
    e.events.enabled = True
    yield e
    e.close()


def test_a_job_at_the_top_level_is_level_1_and_q1_everywhere(engine):
    job = engine.add_request([5, 6, 7, 8], SamplingParams(max_tokens=14, ignore_eos=True))
    engine.step()
    assert job.level == 0  # the scheduler's own count is unchanged

    now = time.time()
    info = job_info(job, now)
    assert info.level == 1
    snap = build_snapshot(EngineFace(engine), SLOWindow(60.0, 0.1), 1, now)
    assert [lv.index for lv in snap.levels] == [1, 2, 3]
    assert job.job_id in snap.levels[0].job_ids and snap.jobs[0].level == 1
    first = [wire_event(e) for e in engine.events.drain()]
    kinds = {e.kind: e.detail.get("level") for e in first if e.job_id == job.job_id}
    assert kinds["arrive"] == 1 and kinds["start"] == 1

    for _ in range(10):  # the quantum of Q1 is spent: demoted to Q2
        engine.step()
    assert job.level == 1
    demoted = [wire_event(e) for e in engine.events.drain() if e.kind == "demote"]
    assert [e.detail["level"] for e in demoted] == [2]

    # fsctl jobs / job / watch say Q1 (and Q2 for the demotion)
    assert fmt.job_lines(info)[2].split() == ["level", "Q1"]
    table = fmt.jobs_table([info])
    assert list(table.columns[2].cells) == ["Q1"]  # the LVL column
    assert "level=Q2" in fmt.event_line(demoted[0])
    # the console: the levels panel and the job table start at Q1, as before v2
    state = fold([snap, *first])
    view = state.view()
    row = next(r for r in view.rows if r.job_id == job.job_id)
    assert render.job_cells(row)[1][0] == "Q1"
    assert render.levels_panel(view).plain.splitlines()[0].startswith("Q1 ")
    history = state.job_history(job.job_id)
    assert history is not None and {t.level for t in history.transitions} == {1}
    engine.abort(job.job_id)


def test_events_without_a_level_keep_their_detail():
    from fsd.engine.events import EventLog

    log = EventLog(enabled=True)
    log.add(1.0, "retune", None, quantum_ratio=3.0)
    log.add(1.0, "arrive", None, prompt_tokens=4, level=0)
    retune, arrive = log.drain()
    assert retune.detail == {"quantum_ratio": 3.0}
    assert arrive.detail == {"prompt_tokens": 4, "level": 1}
    assert isinstance(wire_event(arrive), P.Event)
