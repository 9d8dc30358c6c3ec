"""Chunked prefill's budget: how many prompt tokens one iteration may carry.

Why the default is derived, not a constant. Chunking a prefill does not shorten
anyone's work: every iteration still reads the weights once, so a prompt split in k
chunks reaches its first token about k - 1 decode steps later, while the jobs
running beside it get those k - 1 tokens sooner and finish about when they would
have (every fixed chunk size raises the mean per-token latency: docs/chunked-prefill.md).
What a split buys is the running jobs' time between tokens, which a whole long prompt
stalls for many decode steps. So a prefill is split only where it would stall
them past their per-token SLO: unset, the budget is the most prompt tokens whose
prefill fits one SLO (the profile's, 10 x its shortest iteration), in whole KV
blocks. It follows the hardware and the model instead of one workload; an operator
who wants time between tokens near a decode step sets a small budget.
"""

from __future__ import annotations

from fsd.cost import CostModel
from fsd.sched.slo import default_slo


def prefill_budget(chunk: int | None, cost: CostModel, block_size: int) -> int:
    """The prompt tokens one iteration may carry (0: whole prefills, no chunking).

    `chunk`: the setting (`SchedConfig.prefill_chunk`); None derives it from the SLO.
    """
    if chunk is not None:
        return chunk
    slo = default_slo(cost)
    lo, hi = 0, 1
    while cost.prefill_time(hi) <= slo and hi < 1 << 24:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # the largest n with prefill_time(n) <= slo
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost.prefill_time(mid) <= slo else (lo, mid)
    return max(block_size, lo - lo % block_size)


def chunk_share(cost: CostModel, start: int, step: int) -> float:
    """prefill(start + step) - prefill(start): a chunk's part of its whole prefill, so a
    prompt's chunks are charged exactly what the whole prefill would have been."""
    prefill = cost.prefill_time
    return prefill(start + step) - (prefill(start) if start else 0.0)
