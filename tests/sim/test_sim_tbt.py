"""Time between tokens (TBT) in the simulator's metrics: hand-computed gaps."""

from __future__ import annotations

import numpy as np
import pytest

from fsd.sim import simulate
from fsd.sim.metrics import token_gaps
from fsd.workload import Request, Workload
from tests.costs import linear_cost

# prefill(n) = 0.5 + 0.125 n; a decode step = 0.25 whatever the batch (easy to add by hand)
HAND = linear_cost(
    "hand", prefill=(0.5, 0.125), decode=(0.25, 0.0, 0.0), kv_bytes_per_token=1000,
    swap_bytes_per_s=1e6,
)  # fmt: skip
THREE = Workload((Request(0.0, 4, 3), Request(0.5, 4, 2), Request(1.0, 8, 1)))


def test_batched_gaps_hand_computed():
    # 0-1.0: A's prefill alone (A's 1st token).  1.0-2.75: A decodes while B and C
    # prefill (0.25 + 0.5 + 1.0): A's 2nd, B's 1st, C's only token.  2.75-3.0: A and B
    # decode.  Gaps: A 1.75 then 0.25, B 0.25, C none.
    r = simulate(THREE, HAND, "fcfs", max_batch_size=3, num_gpu_blocks=64)
    a, b, c = r.jobs
    assert list(a.gaps) == pytest.approx([1.75, 0.25])
    assert list(b.gaps) == pytest.approx([0.25])
    assert list(c.gaps) == [] and c.max_gap == 0.0
    assert a.max_gap == pytest.approx(1.75)
    m = r.metrics
    assert m["tbt_mean"] == pytest.approx((1.75 + 0.25 + 0.25) / 3)
    assert m["tbt_p50"] == pytest.approx(0.25)
    assert m["tbt_p99"] == pytest.approx(0.25 + 0.98 * 1.5)  # numpy's linear interpolation
    assert m["tbt_max"] == pytest.approx(1.75)
    # TTFTs 1.0, 2.25, 1.75
    assert m["ttft_p99"] == pytest.approx(np.percentile([1.0, 2.25, 1.75], 99))
    # token-weighted TBT against job-weighted TPOT: (1.0 + 0.25) / 2 per job
    assert m["tpot"] == pytest.approx(0.625)


def test_one_at_a_time_every_gap_is_a_decode_step():
    # A: prefill 0-1.0, decodes at 1.25 and 1.5; B: prefill 1.5-2.5, decode at 2.75.
    r = simulate(THREE, HAND, "fcfs", max_batch_size=1, num_gpu_blocks=64)
    assert token_gaps(r.jobs).tolist() == pytest.approx([0.25, 0.25, 0.25])
    assert r.metrics["tbt_p99"] == pytest.approx(0.25)


# A (4 prompt tokens, 4 out) decodes when B (8 prompt tokens) arrives at its first token.
PAIR = Workload((Request(0.0, 4, 4), Request(0.5, 8, 1)))


def test_a_whole_prefill_stalls_the_running_decode():
    # 0-1.0: A's prefill.  1.0-2.25: A's decode + B's whole prefill (0.25 + 8 x 0.125).
    # 2.25-2.5, 2.5-2.75: A decodes.  A's gaps: 1.25, 0.25, 0.25.
    r = simulate(PAIR, HAND, "fcfs", num_gpu_blocks=64, block_size=4)
    assert list(r.jobs[0].gaps) == pytest.approx([1.25, 0.25, 0.25])
    assert r.jobs[1].ttft == pytest.approx(2.25 - 0.5)


def test_chunks_of_four_split_the_stall():
    # 1.0-1.75: A's decode + B's first chunk (0.25 + 4 x 0.125; B produces nothing).
    # 1.75-2.5: A's decode + B's last chunk (B's token).  2.5-2.75: A's last decode.
    r = simulate(PAIR, HAND, "fcfs", num_gpu_blocks=64, block_size=4, prefill_chunk=4)
    a, b = r.jobs
    assert list(a.gaps) == pytest.approx([0.75, 0.75, 0.25])
    assert b.ttft == pytest.approx(2.5 - 0.5) and list(b.gaps) == []
    assert r.metrics["tbt_max"] == pytest.approx(0.75)
    assert r.metrics["iterations"] == 4
