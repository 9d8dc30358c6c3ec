"""CUDA graphs of decode steps: buckets, static buffers, padding and the eager fallback.

On a CPU a stand-in capture replays the step function on the static buffers (what a
graph does, without the GPU), so the bookkeeping -- which bucket, what the padding
rows hold, that nothing but decodes replays, one warning on a failed capture -- runs
here; the test marked gpu captures real graphs.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from fsd import LLM, SamplingParams
from fsd.config import ConfigError, ModelConfig
from fsd.engine.cuda_graph import DecodeGraphs, graph_buckets
from fsd.layers.attention import HostLayout

CUDA = torch.cuda.is_available()


class FakeCapture:
    """A 'graph' that re-runs the step on the static buffers into a static output."""

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def __call__(self, run):
        self.captures += 1
        out = run()

        def replay() -> None:
            self.replays += 1
            fresh = run()
            pairs = (out, fresh) if isinstance(out, tuple) else ((out,), (fresh,))
            for static, new in zip(*pairs, strict=True):
                static.copy_(new)

        return replay, out


def failing_capture(run):
    run()  # the warm-up ran; the capture itself fails
    raise RuntimeError("operation not permitted when stream is capturing")


PROMPTS = [[5 + i, 9, 13 + 2 * i, 40][: 2 + i % 3] for i in range(11)]


def lengths(i: int) -> int:
    return 3 + (7 * i) % 13  # jobs end at different steps: the batch shrinks


def generate(graphs_capture=None, at_start: bool = False, **kw):
    llm = LLM("tiny", device="cpu", num_gpu_blocks=256, max_batch_size=16, seed=3, **kw)
    worker = llm.engine.executor.worker
    if graphs_capture is not None:
        worker.graphs = worker._decode_graphs(capture=graphs_capture, force=True)
        if at_start:
            worker.graphs.capture_all()
    params = [SamplingParams(max_tokens=lengths(i), ignore_eos=True) for i in range(len(PROMPTS))]
    out = [list(o.token_ids) for o in llm.generate(PROMPTS, params)]
    graphs = worker.graphs
    llm.close()
    return out, graphs


def test_buckets():
    assert graph_buckets(32) == (1, 2, 4, 8, 16, 24, 32)
    assert graph_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert graph_buckets(1) == (1,)
    assert graph_buckets(3) == (1, 2, 3)
    assert graph_buckets(10_000)[-1] == 512


def test_replayed_decodes_give_the_eager_tokens():
    eager, none = generate()
    assert none is None  # a CPU worker captures nothing
    capture = FakeCapture()
    replayed, graphs = generate(capture)
    assert replayed == eager
    assert capture.replays > 0 and graphs.failed is None
    assert 16 in graphs.captured and len(graphs.captured) >= 3  # the batch shrank through buckets
    assert capture.captures == len(graphs.captured)  # each bucket captured once


def test_a_replayed_greedy_step_takes_the_graphs_argmax(monkeypatch):
    """The graph draws greedy tokens itself: the sampler's own pass runs only for the
    steps that ran eagerly (those with a prefill), and the tokens are the eager ones."""
    import fsd.engine.sampler as sampler

    calls = {"prepare": 0, "draw": 0}
    real_prepare, real_draw = sampler._prepare, sampler.Sampler.draw

    def prepare(*args, **kwargs):
        calls["prepare"] += 1
        return real_prepare(*args, **kwargs)

    def draw(*args, **kwargs):
        calls["draw"] += 1
        return real_draw(*args, **kwargs)

    eager, _ = generate()
    monkeypatch.setattr(sampler, "_prepare", prepare)
    monkeypatch.setattr(sampler.Sampler, "draw", draw)
    capture = FakeCapture()
    replayed, graphs = generate(capture)
    assert replayed == eager and capture.replays > 0
    # every step draws once; only the steps that ran eagerly drew on their own (how
    # many steps there are depends on the measured step times: counted in the same run)
    assert calls["prepare"] == calls["draw"] - capture.replays


def test_every_bucket_captured_at_start_serves_the_eager_tokens_without_another_capture(caplog):
    eager, _ = generate()
    capture = FakeCapture()
    with caplog.at_level(logging.INFO, logger="fsd.engine"):
        replayed, graphs = generate(capture, at_start=True)
    assert replayed == eager and graphs.failed is None
    assert graphs.captured == graph_buckets(16) and capture.captures == len(graph_buckets(16))
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"captured {len(graph_buckets(16))} CUDA graphs in") for m in said), said


def test_a_capture_out_of_memory_at_start_says_what_to_lower():
    def no_memory(run):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    graphs = DecodeGraphs(
        lambda ids, pos, hidden, meta: hidden, max_batch_size=8, max_blocks=4, block_size=16,
        hidden_size=4, dtype=torch.float32, device=torch.device("cpu"), first=False,
        capture=no_memory,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="decode batch of 1 ran out of GPU memory.*max_batch_size"):
        graphs.capture_all()
    assert graphs.captured == ()


def test_a_failed_capture_warns_once_and_runs_eagerly(caplog):
    eager, _ = generate()
    with caplog.at_level(logging.WARNING, logger="fsd.engine"):
        tokens, graphs = generate(failing_capture)
    assert tokens == eager
    warnings = [r for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert len(warnings) == 1 and "eagerly" in warnings[0].getMessage()
    assert graphs.failed is not None and graphs.captured == ()


def test_only_decode_only_steps_replay():
    graphs = DecodeGraphs(
        lambda ids, pos, hidden, meta: hidden,
        max_batch_size=8,
        max_blocks=4,
        block_size=16,
        hidden_size=4,
        dtype=torch.float32,
        device=torch.device("cpu"),
        first=False,
        capture=FakeCapture(),
    )
    decode = HostLayout.build([1, 1, 1], [5, 17, 64], [(0,), (1, 2), (3, 4, 5, 6)], 16)
    assert graphs.bucket(decode) == 4
    assert graphs.bucket(HostLayout.build([1, 3], [5, 3], [(0,), (1,)], 16)) is None
    assert graphs.bucket(HostLayout.build([1], [65], [(0, 1, 2, 3, 4)], 16)) is None  # too long
    assert graphs.bucket(HostLayout.build([1] * 9, [1] * 9, [(i,) for i in range(9)], 16)) is None
    hidden = torch.arange(12, dtype=torch.float32).view(3, 4)
    ids = np.array([7, 8, 9])
    out = graphs.run(decode, ids, decode.positions, hidden)
    torch.testing.assert_close(out, hidden)  # a later stage's activations go through
    assert graphs.slot_mapping[3].item() == -1 and graphs.context_lens[3].item() == 1
    assert graphs.slot_mapping[:3].tolist() == decode.slot_mapping.tolist()
    assert graphs.block_tables[2].tolist() == [3, 4, 5, 6]
    assert graphs.input_ids[:3].tolist() == [7, 8, 9]
    assert graphs.positions[:3].tolist() == [4, 16, 63]


def test_cuda_graphs_is_a_model_option():
    assert ModelConfig().cuda_graphs is True
    assert ModelConfig(cuda_graphs=False).cuda_graphs is False
    with pytest.raises(ConfigError):
        ModelConfig(cuda_graphs="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_real_graphs_on_a_gpu_match_eager():
    params = [SamplingParams(max_tokens=lengths(i), ignore_eos=True) for i in range(len(PROMPTS))]
    runs = {}
    for graphs in (False, True):
        # a fixed pool: the other GPU test files may hold memory on the same device
        llm = LLM(
            "tiny", device="cuda", max_batch_size=16, seed=3, cuda_graphs=graphs,
            num_gpu_blocks=1024,
        )  # fmt: skip
        runs[graphs] = [list(o.token_ids) for o in llm.generate(PROMPTS, params)]
        g = llm.engine.executor.worker.graphs
        if graphs:
            assert g is not None and g.failed is None and g.captured
        else:
            assert g is None
        llm.close()
    assert runs[True] == runs[False]
