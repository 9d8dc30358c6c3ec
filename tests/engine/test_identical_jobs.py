"""Among identical jobs, a preempted job never waits behind identical jobs that arrived
after it (issue P16: live, one of 30 injected jobs was preempted 0.03 s after it
started and ran again 108 s later, while the 29 that arrived after it ran).

The real engine on the default policy, under a controllable clock: time moves on by
`slow` x the profile's decode step at each step submitted, so the run sees what a
machine that much slower than its profile sees (starvation promotions, live cost)
whatever machine runs the test.
"""

from __future__ import annotations

import time

import pytest

from fsd import LLM, SamplingParams
from fsd.cost import CostModel

N = 30  # as `fsctl inject --count 30 --input-len 256 --output-len 64`


class SlowClock:
    """time.time / time.perf_counter for the engine: time moves only when a step is
    submitted, by `step` seconds (so every reading between two submissions agrees, and
    the run is the same on any machine)."""

    def __init__(self, step: float) -> None:
        self.now = 1_000.0
        self.step = step

    def time(self) -> float:
        return self.now

    def stepping(self, submit):  # noqa: ANN001, ANN201 - wraps the executor's submit
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            self.now += self.step
            return submit(*args, **kwargs)

        return run


@pytest.mark.parametrize(
    "gpu_blocks, slow, max_tokens, preempts",
    [
        (1024, 1.0, 64, False),
        (1024, 100.0, 64, False),
        (1024, 400.0, 64, False),
        # 3 jobs' KV on the device: admission starts no 4th prompt that could not finish
        (64, 100.0, 64, False),
        # ... and when the 3 outgrow it, the youngest goes to host memory and is back
        # before any later job starts
        (64, 100.0, 128, True),
    ],
    ids=["roomy", "roomy-slow", "roomy-very-slow", "tight-pool-slow", "tight-pool-preempting"],
)
def test_a_preempted_job_never_waits_behind_later_identical_jobs(
    monkeypatch, tmp_path, gpu_blocks, slow, max_tokens, preempts
):
    profile = tmp_path / "fixed.json"  # a fixed cost model: nothing depends on this machine
    CostModel(name="fixed-test").save(profile)
    llm = LLM(
        "tiny", num_gpu_blocks=gpu_blocks, num_host_blocks=512, max_batch_size=8,
        prefix_cache=False, seed=0, profile=str(profile),
    )  # fmt: skip
    try:
        executor = llm.engine.executor
        clock = SlowClock(slow * llm.engine.cost.min_iteration_time)
        monkeypatch.setattr(time, "time", clock.time)
        monkeypatch.setattr(time, "perf_counter", clock.time)
        monkeypatch.setattr(executor, "submit", clock.stepping(executor.submit))
        prompt = [(k * 7) % 250 + 1 for k in range(256)]
        outs = llm.generate([prompt] * N, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    finally:
        monkeypatch.undo()
        llm.close()
    order = sorted(range(N), key=lambda i: (outs[i].arrival_time, i))
    overtaken = [
        (a, b)
        for k, a in enumerate(order)
        for b in order[k + 1 :]
        if outs[b].finish_time < outs[a].finish_time
    ]
    assert not overtaken, (
        f"{len(overtaken)} pairs: a later identical job finished first, e.g. {overtaken[:3]}; "
        f"preemptions {[outs[i].preemptions for i in order]}"
    )
    assert all(len(o.token_ids) == max_tokens for o in outs)
    assert any(o.preemptions for o in outs) == preempts
