"""`fsctl top` left open: an hour of telemetry (jobs arriving, moving and ending all the
while) leaves the console's data and its screen no larger than after the first minutes.

Measured with tracemalloc (Python's own allocations, exact), not RSS: after a warm-up
that fills every bounded ring and the ended-jobs window, the traced size must stay
flat. A leak of a few bytes per frame would show as tens of KB over the run.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import tracemalloc
from collections.abc import Iterator

import pytest

from fsd import protocol as P
from fsd.console.top.app import TopApp
from fsd.console.top.data import ENDED_KEPT, TopState
from tests.wire_samples import job_row, kv_info, slo_info

HZ = 10  # the daemon's default telemetry rate
LIVE = 24  # jobs in the queues at any time


def telemetry(frames: int) -> Iterator[P.Snapshot | P.Event]:
    """`frames` snapshots at HZ: each frame one job ends (with its event) and a new one
    arrives, jobs move between levels, and every fifth frame carries the job table."""
    live = [f"job-{n}" for n in range(LIVE)]
    born = LIVE
    for i in range(frames):
        t = 100.0 + i / HZ
        gone = live.pop(0)
        yield P.Event(time=t, kind="finish", job_id=gone, detail={"reason": "length"})
        live.append(f"job-{born}")
        born += 1
        levels = [live[j::3] for j in range(3)] if i % 2 else [live[:8], live[8:], []]
        table = None
        if i % 5 == 0:
            table = [
                job_row(job_id=jid, level=1 + k % 3, output_tokens=i % 50, state="running")
                for k, jid in enumerate(live)
            ]  # fmt: skip
        yield P.Snapshot(
            time=t, seq=i, policy="fsd",
            levels=[P.LevelInfo(index=k + 1, quantum=0.01 * 2**k, job_ids=ids) for k, ids in enumerate(levels)],  # fmt: skip
            jobs=table, jobs_time=t if table is not None else None,
            kv=kv_info(device_used=i % 40, swapped_out_bytes=i * 4096, swapped_in_bytes=i * 2048),
            iterations=[P.IterationInfo(start=t, duration=0.02, batch_size=8, prefill_tokens=0, decode_tokens=8)],  # fmt: skip
            slo=slo_info(), config={"policy": "fsd"},
        )  # fmt: skip


def traced(clear_bounded_caches: bool = False) -> int:
    """Python's traced bytes now; optionally after emptying every functools cache that
    has a maxsize (rich's and Textual's text-measure caches: bounded by the libraries,
    they fill over minutes). An unbounded cache stays, and counts."""
    if clear_bounded_caches:
        for obj in gc.get_objects():
            if isinstance(obj, functools._lru_cache_wrapper) and obj.cache_info().maxsize:
                obj.cache_clear()
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def test_an_hour_of_telemetry_leaves_the_consoles_data_as_large_as_a_few_minutes():
    state = TopState()
    frames = telemetry(HZ * 3600)
    tracemalloc.start()
    try:
        marks = []
        for _quarter in range(4):  # a quarter of an hour each
            for _ in range(2 * HZ * 900):  # a snapshot and an event per frame
                state.apply(next(frames))
            state.view()
            marks.append(traced())
    finally:
        tracemalloc.stop()
    assert len(state._histories) <= ENDED_KEPT + LIVE  # ended jobs: a bounded window
    # the first quarter fills the rings and the window; after it nothing grows
    assert marks[3] - marks[1] < 32 * 1024, marks


@pytest.mark.slow
def test_the_screen_does_not_grow_with_frames():
    async def run() -> list[int]:
        state = TopState()
        app = TopApp(None, None, state=state)
        frames = telemetry(3000)
        marks = []
        async with app.run_test(size=(160, 48)) as pilot:
            tracemalloc.start()
            try:
                for _block in range(3):
                    for i in range(1000):
                        state.apply(next(frames))
                        state.apply(next(frames))
                        app.render_view(state.view())
                        if i % 50 == 0:
                            await pilot.pause()  # the screen updates
                    await pilot.pause()
                    marks.append(traced(clear_bounded_caches=True))
            finally:
                tracemalloc.stop()
        return marks

    marks = asyncio.run(run())
    assert marks[2] - marks[1] < 64 * 1024, marks  # measured: about 3 KB (noise)
