"""The block tables of the jobs a worker runs, kept between steps (a persistent batch).

A decode step changes few tables: a job gains a block every `block_size` tokens.
So the driver sends each job's new blocks only (`fsd.engine.plan.TableMirror`), and
the worker keeps every table in one array, a row per job, from which a step's
tables are one gather. A plan whose table does not follow what the worker holds
is refused (ValueError), never run on stale blocks.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from fsd.engine.plan import StepPlan


class BlockTables:
    """A row of block ids per job, and how many of them are its table."""

    def __init__(self, width: int = 64, rows: int = 16) -> None:
        self._rows: dict[str, int] = {}
        self._free = list(range(rows - 1, -1, -1))
        self._tables = np.zeros((rows, width), np.int32)
        self._lens = np.zeros(rows, np.int64)

    def __len__(self) -> int:
        return len(self._rows)

    def forget(self, job_ids: Iterable[str]) -> None:
        """These jobs ended: their rows are free."""
        for job_id in job_ids:
            row = self._rows.pop(job_id, None)
            if row is not None:
                self._lens[row] = 0
                self._free.append(row)

    def update(self, plan: StepPlan) -> tuple[np.ndarray, np.ndarray]:
        """Apply the plan's changes (applying them twice is harmless: a plan re-run in
        parts); its tables [seqs, widest] padded with 0, and their widths."""
        rows = np.empty(plan.num_seqs, np.int64)
        for k, (job_id, start, blocks) in enumerate(
            zip(plan.job_ids, plan.table_starts, plan.block_tables, strict=True)
        ):
            row = self._rows.get(job_id)
            if row is None:
                if start:
                    raise ValueError(f"job {job_id}: the worker never had its block table")
                row = self._rows[job_id] = self._new_row()
            elif start > self._lens[row]:
                raise ValueError(
                    f"job {job_id}: its table changes from block {start}, "
                    f"but the worker holds {self._lens[row]}"
                )
            end = start + len(blocks)
            if blocks:
                if end > self._tables.shape[1]:
                    self._grow(columns=end)
                self._tables[row, start:end] = blocks
            self._lens[row] = end
            rows[k] = row
        widths = self._lens[rows]
        width = max(int(widths.max()) if len(rows) else 0, 1)
        tables = self._tables[rows, :width]  # (a copy: fancy indexing)
        tables[np.arange(width)[None, :] >= widths[:, None]] = 0
        return tables, widths

    def _new_row(self) -> int:
        if not self._free:
            n = self._tables.shape[0]
            self._grow(rows=2 * n)
            self._free.extend(range(2 * n - 1, n - 1, -1))
        return self._free.pop()

    def _grow(self, rows: int = 0, columns: int = 0) -> None:
        old = self._tables
        shape = (
            max(rows, old.shape[0]),
            max(2 * old.shape[1], columns) if columns else old.shape[1],
        )
        self._tables = np.zeros(shape, np.int32)
        self._tables[: old.shape[0], : old.shape[1]] = old
        lens = np.zeros(shape[0], np.int64)
        lens[: len(self._lens)] = self._lens
        self._lens = lens
