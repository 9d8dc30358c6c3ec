"""A step's tokens as the worker hands them back, and the last step's kept for the next.

Scheduling one step ahead (fsd.engine.ahead) means the engine lays out step N+1
before step N's tokens reach the host. A job in both feeds step N's token to step
N+1: the plan marks that input as pending (`StepPlan.pending`), and the worker fills
it from step N's tokens where they were drawn, so the device never waits for the
host. `StepTokens.values` is the one place the host waits for a step's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fsd.engine.plan import StepPlan
from fsd.engine.sampler import Drawn
from fsd.layers.attention import upload


class StepTokens:
    """The last stage's tokens of one plan, in its order: a token, a JobFault, or None
    for a prefill chunk that drew nothing."""

    __slots__ = ("drawn", "n", "rows")

    def __init__(self, drawn: Drawn | None, rows: Sequence[int] | None, n: int) -> None:
        self.drawn, self.rows, self.n = drawn, rows, n  # rows None: every row drew

    def values(self) -> list[Any]:
        """Wait for the tokens (on a GPU, their copy to the host) and list them."""
        if self.drawn is None:
            return [None] * self.n
        if self.rows is None:
            return self.drawn.values(self.n)
        out: list[Any] = [None] * self.n
        for i, token in zip(self.rows, self.drawn.values(len(self.rows)), strict=True):
            out[i] = token
        return out


class DrawnTokens:
    """The tokens the previous plan drew, by job, where they were drawn.

    A plan re-run in parts (fsd.engine.executor isolates a failing job) keeps every
    part under the same plan number.
    """

    def __init__(self) -> None:
        # plan number -> its parts: (tokens, job id -> row); the last two plans
        self._plans: dict[int, list[tuple[torch.Tensor | None, dict[str, int]]]] = {}

    def keep(self, plan: StepPlan, drawn: Drawn | None, rows: Sequence[int] | None) -> None:
        """`plan`'s sampling `rows` (None: all) drew `drawn`."""
        parts = self._plans.setdefault(plan.seq, [])
        for seq in [s for s in self._plans if s < plan.seq - 1]:
            del self._plans[seq]
        ids = plan.job_ids if rows is None else [plan.job_ids[i] for i in rows]
        tokens = None if drawn is None else drawn.tokens
        parts.append((tokens, {job_id: k for k, job_id in enumerate(ids)}))

    def forward(
        self, plan: StepPlan, device: torch.device
    ) -> Callable[[torch.Tensor], None] | None:
        """What writes `plan`'s pending inputs into its input ids, from the tokens the
        plan before it drew (None: it has none)."""
        pending = plan.pending
        if not pending:
            return None
        parts = self._plans.get(plan.seq - 1, [])
        where, take = [], []
        for index, job_id in pending:
            for part, (_, rows) in enumerate(parts):
                if job_id in rows:
                    where.append(index)
                    take.append((part, rows[job_id]))
                    break
            else:
                raise RuntimeError(f"job {job_id}: its last token was not drawn by the last step")
        dst = upload(np.asarray(where, dtype=np.int64), device)
        picks = []
        for part, (tokens, _) in enumerate(parts):
            rows = [row for p, row in take if p == part]
            if rows:
                if tokens is None:  # every row of that part failed: its jobs end anyway
                    picks.append(torch.zeros(len(rows), dtype=torch.long, device=device))
                else:
                    picks.append(tokens[upload(np.asarray(rows, dtype=np.int64), device)])
        # parts are walked in order above, so `take` sorted by part matches `where`
        order = sorted(range(len(take)), key=lambda k: take[k][0])
        dst = dst[upload(np.asarray(order, dtype=np.int64), device)] if len(picks) > 1 else dst
        src = picks[0] if len(picks) == 1 else torch.cat(picks)

        def fill(ids: torch.Tensor) -> None:
            ids[dst] = src.to(ids.dtype)

        return fill
