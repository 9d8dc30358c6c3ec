"""Telemetry reports a chunked prefill's progress: each job's `prefilled` next to its prompt.

A real engine prefills a 200-token prompt in chunks of 16; between the chunks the
job's row (the snapshot's, and `fsctl jobs` / `job`, which read the same JobInfo)
says how far it got. A frame from a daemon that predates the field still decodes.
"""

from __future__ import annotations

import time

import msgspec
import pytest

from fsd import LLM
from fsd import protocol as P
from fsd.console import cli_format as fmt
from fsd.engine.face import EngineFace
from fsd.jobs import SamplingParams
from fsd.metrics import SLOWindow
from fsd.server.publish.telemetry import build_snapshot
from tests.wire_samples import job_row

PROMPT = list(range(5, 205))  # 200 tokens: 13 chunks of 16


@pytest.fixture(scope="module")
def llm():
    with LLM("tiny", prefill_chunk=16, max_batch_tokens=64, num_gpu_blocks=512) as llm:
        yield llm


def snapshot_row(llm: LLM, job_id: str) -> P.JobInfo:
    """The job's row of a snapshot built as the daemon builds it, over the wire and back."""
    snap = build_snapshot(EngineFace(llm.engine), SLOWindow(60.0, 0.1), 1, time.time())
    back = P.decode_snapshot(P.encode(snap))
    rows = {j.job_id: j for j in back.jobs or []}
    return rows[job_id]


def test_a_partly_prefilled_job_shows_its_progress(llm):
    engine = llm.engine
    job = engine.add_request(PROMPT, SamplingParams(max_tokens=4, ignore_eos=True))
    before = snapshot_row(llm, job.job_id)
    assert before.prefilled == 0 and before.prompt_tokens == 200
    engine.step()
    engine.step()
    row = snapshot_row(llm, job.job_id)
    assert 0 < row.prefilled < row.prompt_tokens == 200  # type: ignore[operator]
    assert row.prefilled == job.num_prefilled and row.output_tokens == 0
    # fsctl jobs / job print it
    progress = f"{row.prefilled}/200"
    table = fmt.jobs_table([row])
    prefill_col = next(c for c in table.columns if c.header == "PREFILL")
    assert list(prefill_col.cells) == [progress]
    percent = row.prefilled * 100 // 200  # type: ignore[operator]
    assert fmt.detail_line("prefill", f"{progress} tokens ({percent}%)") in fmt.job_lines(row)
    # once the whole prompt is cached the progress is done
    while job.num_prefilled < job.num_prompt_tokens:
        engine.step()
    row = snapshot_row(llm, job.job_id)
    assert row.prefilled == row.prompt_tokens == 200
    assert fmt.prefill_progress(row.prefilled, row.prompt_tokens) == ""
    assert fmt.detail_line("prefill", "done") in fmt.job_lines(row)
    assert list(fmt.jobs_table([row]).columns[7].cells) == ["-"]
    engine.abort(job.job_id)


def test_a_job_row_without_prefilled_still_decodes():
    # a snapshot from a daemon before chunked prefill: its job rows have no `prefilled`
    row = job_row()
    old = msgspec.msgpack.encode(row)
    assert b"prefilled" not in old  # None is the default: omitted, as the old daemon sent it
    back = msgspec.msgpack.decode(old, type=P.JobInfo)
    assert back.prefilled is None
    assert not any(line.startswith("prefill") for line in fmt.job_lines(back))
    assert list(fmt.jobs_table([back]).columns[7].cells) == ["-"]
