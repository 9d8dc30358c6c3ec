"""Closing an offline engine gives its weights' and KV's memory back.

On a GPU the next engine sizes its KV from the memory left free, so an engine that
kept its tensors after close() left the next one no room (the GPU check found it:
a second `LLM` in one process got a negative KV budget).
"""

from __future__ import annotations

import gc
import weakref

from fsd import LLM, SamplingParams


def test_close_releases_weights_and_kv_and_a_second_engine_runs():
    llm = LLM("tiny", num_gpu_blocks=64, seed=1)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    first = [list(o.token_ids) for o in llm.generate(["a b c"], params)]
    executor = llm.engine.executor
    kv = weakref.ref(executor.pool.data)
    weight = weakref.ref(next(executor.worker.model.parameters()))
    llm.close()
    gc.collect()
    assert kv() is None and weight() is None
    assert executor.worker.model is None and executor.worker.pool is None
    again = LLM("tiny", num_gpu_blocks=64, seed=1)
    try:
        assert [list(o.token_ids) for o in again.generate(["a b c"], params)] == first
    finally:
        again.close()
