"""The per-token latency SLO: the one rule the policies, chunked prefill, admission
of late jobs, the daemon's SLO window and the simulator's metrics share.

FastServe's SLO is a number of decode steps: 10 x the profile's shortest iteration
(`CostModel.min_iteration_time`), so it follows the hardware and the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsd.cost import CostModel

SLO_DECODE_STEPS = 10  # the per-token latency SLO: 10 decode steps


def default_slo(cost: CostModel) -> float:
    """The paper's per-token latency SLO: 10 decode steps (the profile's minimum iteration)."""
    return SLO_DECODE_STEPS * cost.min_iteration_time
