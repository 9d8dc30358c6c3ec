"""The persistent batch: plans carry only the block tables' changes, and the worker's
tables are then exactly the jobs' own."""

from __future__ import annotations

import numpy as np
import pytest

from fsd.engine.block_tables import BlockTables
from fsd.engine.plan import TableMirror, build_plan, sub_plan
from fsd.jobs import Job, SamplingParams


def job(job_id: str, table: list[int], tokens: int = 40) -> Job:
    j = Job(prompt_token_ids=list(range(1, tokens + 1)), params=SamplingParams())
    j.job_id, j.block_table = job_id, table
    j.num_computed_tokens, j.step_tokens = tokens - 1, 1
    return j


def tables_of(worker: BlockTables, plan) -> list[list[int]]:
    tables, widths = worker.update(plan)
    return [list(row[:w]) for row, w in zip(tables, widths, strict=True)]


def test_grown_replaced_and_forgotten_tables_reach_the_worker_exactly():
    mirror, worker = TableMirror(), BlockTables(width=2, rows=1)  # both grow
    a, b = job("a", [1, 2, 3]), job("b", [7, 8, 9])
    plan = build_plan(1, [a, b], mirror=mirror)
    assert plan.table_starts == (0, 0)
    assert tables_of(worker, plan) == [[1, 2, 3], [7, 8, 9]]
    a.block_table.append(4)  # grows: only the new block travels
    plan = build_plan(2, [a, b], mirror=mirror)
    assert plan.block_tables == ((4,), ()) and plan.table_starts == (3, 3)
    assert tables_of(worker, plan) == [[1, 2, 3, 4], [7, 8, 9]]
    b.block_table[:] = [5, 6, 7]  # replaced (preempted, back on other blocks): sent whole
    b.table_epoch += 1
    plan = build_plan(3, [b, a], mirror=mirror)
    assert plan.table_starts == (0, 4)
    assert tables_of(worker, plan) == [[5, 6, 7], [1, 2, 3, 4]]
    again = tables_of(worker, sub_plan(plan, range(0, 1)))  # a part re-run: same tables
    assert again == [[5, 6, 7]]
    worker.forget(["a"])
    mirror.forget("a")
    c = job("a", [11])  # a new job under the ended one's id
    assert tables_of(worker, build_plan(4, [c], mirror=mirror)) == [[11]]
    assert len(worker) == 2


def test_padding_past_a_table_is_zero_even_on_a_reused_row():
    mirror, worker = TableMirror(), BlockTables()
    long = job("x", list(range(1, 9)))
    tables_of(worker, build_plan(1, [long], mirror=mirror))
    worker.forget(["x"])
    mirror.forget("x")
    short, wide = job("y", [3]), job("z", [4, 5, 6])
    tables, widths = worker.update(build_plan(2, [short, wide], mirror=mirror))
    assert widths.tolist() == [1, 3]
    assert tables.tolist() == [[3, 0, 0], [4, 5, 6]]
    assert tables.dtype == np.int32


def test_a_plan_that_does_not_follow_the_workers_tables_is_refused():
    mirror, worker = TableMirror(), BlockTables()
    a = job("a", [1, 2])
    tables_of(worker, build_plan(1, [a], mirror=mirror))
    a.block_table.append(3)
    lost = build_plan(2, [a], mirror=mirror)  # never reaches the worker
    a.block_table.append(4)
    with pytest.raises(ValueError, match="the worker holds 2"):
        worker.update(build_plan(3, [a], mirror=mirror))
    with pytest.raises(ValueError, match="never had its block table"):
        BlockTables().update(lost)
