"""The job profiler: the fitter on exact data, and quick profiles of the real tiny engine.

No timing is asserted: wall-clock numbers on a shared CPU are noise. The tests check
the fit's algebra, that profiling leaves the engine as it found it, how many engine
iterations it costs (counted), and that a fit follows its own measurements.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from fsd.config import EngineConfig
from fsd.cost import CostModel
from fsd.cost.fit import (
    ChunkSample,
    DecodeSample,
    PrefillSample,
    chunk_series,
    fit_cost_model,
    fit_decode,
    fit_prefill,
    nnls,
)
from fsd.engine.core import Engine
from fsd.engine.profiler import CHUNK_SIZES, calibrate, make_plan, profile_engine
from fsd.errors import ConfigError
from fsd.profile_command import chunk_report, print_report, run_profile_command

QUICK_MAX_ITERATIONS = 50

# ---- the fitter ------------------------------------------------------------------------


def test_nnls_matches_lstsq_when_the_optimum_is_nonnegative():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 2.0, size=(12, 3))
    x = np.array([0.3, 1.7, 0.05])
    assert np.allclose(nnls(a, a @ x), x, rtol=1e-9)


def test_nnls_clips_a_negative_slope_to_zero():
    n = np.array([16.0, 64.0, 256.0, 1024.0])
    a = np.stack([np.ones_like(n), n], axis=1)
    y = 1.0 - 1e-4 * n  # falls with n: the best non-negative fit has slope 0
    x = nnls(a, y)
    assert x[1] == 0.0
    assert x[0] > 0
    assert (x >= 0).all()


def test_fitter_recovers_prefill_coefficients_from_exact_data():
    base, a, b = 2e-3, 3e-5, 4e-9
    samples = [
        PrefillSample(n, [base + a * n + b * n * n] * 3) for n in (16, 32, 64, 128, 512, 2048)
    ]
    got = fit_prefill(samples)
    assert got == pytest.approx((base, a, b), rel=1e-6)


def test_fitter_recovers_decode_coefficients_from_exact_data():
    base, per_seq, per_ctx = 5e-3, 2e-4, 3e-8
    samples = [
        DecodeSample(bs, ctx, [base + per_seq * bs + per_ctx * bs * ctx])
        for bs in (1, 2, 8, 32)
        for ctx in (16, 256, 2048)
    ]
    assert fit_decode(samples) == pytest.approx((base, per_seq, per_ctx), rel=1e-6)


def test_fitter_keeps_a_true_zero_at_zero():
    samples = [PrefillSample(n, [1e-3 + 1e-5 * n]) for n in (16, 64, 256, 1024)]
    base, a, b = fit_prefill(samples)
    assert (base, a) == pytest.approx((1e-3, 1e-5), rel=1e-6)
    assert 0.0 <= b < 1e-15


def test_sample_cost_is_the_fastest_repeat():
    s = DecodeSample(4, 100, [0.010, 0.002, 0.150])
    assert s.seconds == 0.002
    assert s.median == 0.010
    assert s.noisy
    assert not DecodeSample(1, 1, [0.002, 0.0021, 0.0022]).noisy


def test_fit_cost_model_records_points_and_residuals():
    pre = [PrefillSample(n, [1e-3 + 2e-5 * n]) for n in (16, 64, 256)]
    dec = [DecodeSample(b, c, [2e-3 + 1e-4 * b + 1e-8 * b * c]) for b in (1, 4) for c in (16, 512)]
    cost = fit_cost_model(pre, dec, name="synthetic", kv_bytes_per_token=8, swap_bytes_per_s=1e9)
    assert cost.name == "synthetic" and cost.kv_bytes_per_token == 8
    assert len(cost.notes["prefill"]) == 3 and len(cost.notes["decode"]) == 4
    assert cost.notes["fit"]["prefill"]["max_abs_rel"] < 1e-9
    assert cost.notes["fit"]["decode"]["max_abs_rel"] < 1e-9
    json.loads(cost.to_json())  # notes are plain JSON
    with pytest.raises(ConfigError):
        fit_cost_model([], dec)


# ---- profiling the real tiny engine -----------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig.from_kwargs(model="tiny", num_gpu_blocks=512, max_batch_size=8))


def _counting(monkeypatch: pytest.MonkeyPatch, engine: Engine) -> list[int]:
    calls = [0]
    execute = engine.executor.execute

    def counted(batch):  # noqa: ANN001, ANN202
        calls[0] += 1
        return execute(batch)

    monkeypatch.setattr(engine.executor, "execute", counted)
    return calls


def test_engine_starts_with_a_calibrated_cost_model(engine):
    assert engine.cost.notes["source"].startswith("measured")
    assert engine.cost.notes["mode"] == "quick"
    assert engine.scheduler.cost is engine.cost
    assert engine.blocks.num_free == engine.blocks.device.num_blocks


def test_quick_profile_of_the_tiny_engine(engine, monkeypatch):
    calls = _counting(monkeypatch, engine)
    plan = make_plan(engine, quick=True)
    seen: list[tuple[int, int, str]] = []
    # How well the fit matches is a matter of the machine's timing noise, so it is
    # reported by `fsd profile`, not asserted; the fitter's maths is tested on exact data.
    cost = profile_engine(engine, quick=True, progress=lambda *a: seen.append(a))
    # Every KV block is back, and the pool's bookkeeping is whole.
    engine.blocks.check()
    assert engine.blocks.num_free == engine.blocks.device.num_blocks
    assert not engine.has_unfinished()
    # Few iterations, counted at the executor.
    assert calls[0] == cost.notes["iterations"] <= plan.max_iterations <= QUICK_MAX_ITERATIONS
    # Positive coefficients where the tiny model certainly has a cost.
    for key in ("prefill_base", "prefill_per_token", "prefill_per_token2", "decode_base",
                "decode_per_seq", "decode_per_ctx_token"):  # fmt: skip
        assert getattr(cost, key) >= 0
    # (a fixed cost may fit to 0 on a loaded machine; the totals below may not)
    assert cost.prefill_per_token + cost.prefill_per_token2 > 0
    assert cost.min_iteration_time > 0
    assert cost.prefill_time(512) > cost.prefill_time(16)
    # Progress went through every step in order.
    assert [d for d, _, _ in seen] == list(range(1, plan.num_points + 1))
    assert {t for _, t, _ in seen} == {plan.num_points}
    # KV and swap numbers, and the notes.
    arch = engine.loaded.arch
    assert cost.kv_bytes_per_token == arch.kv_bytes_per_token(engine.loaded.dtype)
    assert cost.swap_bytes_per_s > 0
    assert cost.name == "tiny-cpu-float32" or cost.name.startswith("tiny-")
    for key in ("machine", "engine", "swap", "prefill", "decode", "fit", "iterations"):
        assert key in cost.notes
    assert {p["tokens"] for p in cost.notes["prefill"]} == set(plan.prefill_lengths)
    assert CostModel.from_dict(json.loads(cost.to_json())) == cost
    # No chunk is timed at start-up: the chunk term is derived, and the notes say so.
    assert plan.chunk_points == () and cost.notes["chunk"] == []
    assert cost.prefill_per_ctx_token == 2 * cost.prefill_per_token2
    chunked = cost.notes["chunked_prefill"]
    assert chunked["prefill_per_ctx_token"].startswith("derived")
    assert chunked["prompt_tokens"] == min(2048, engine.max_model_len - 1)
    assert all("measured" not in r for r in chunked["slowdown"].values())


def test_chunk_points_are_timed_and_fitted(engine, monkeypatch):
    # A small plan: a 256-token prompt in chunks of 64, and one more chunk for the fit.
    series = {p for p in chunk_series(256, 64) if p[1]}
    plan = replace(
        make_plan(engine, quick=True),
        prefill_lengths=(16, 64, 256),
        decode_points=((1, 16), (2, 64)),
        repeats=2,
        extra_rounds=0,
        chunk_points=tuple(sorted(series | {(32, 512)})),
        chunk_prompt=256,
        chunk_sizes=(64,),
    )
    calls = _counting(monkeypatch, engine)
    seen: list[str] = []
    cost = profile_engine(engine, plan=plan, progress=lambda d, t, label: seen.append(label))
    engine.blocks.check()
    assert engine.blocks.num_free == engine.blocks.device.num_blocks
    assert calls[0] == cost.notes["iterations"] <= plan.max_iterations
    assert "chunk 64 tokens over 192" in seen and "chunk 32 tokens over 512" in seen
    assert {(c["tokens"], c["cached"]) for c in cost.notes["chunk"]} == set(plan.chunk_points)
    assert cost.prefill_per_ctx_token >= 0
    chunked = cost.notes["chunked_prefill"]
    assert chunked["prefill_per_ctx_token"].startswith("measured")
    assert chunked["prompt_tokens"] == 256
    for ratio in chunked["slowdown"].values():  # timings are noise: only that they exist
        assert ratio["measured"] > 0 and ratio["predicted"] > 0


def test_plans_fit_the_engine_limits(engine):
    quick, full = make_plan(engine, quick=True), make_plan(engine, quick=False)
    for plan in (quick, full):
        assert max(plan.prefill_lengths) <= engine.max_model_len - 1
        for b, c in plan.decode_points:
            assert b <= engine.config.sched.max_batch_size
            assert b * engine.blocks.blocks_for(c) <= engine.blocks.device.num_blocks
        assert len(plan.prefill_lengths) >= 3 and len(plan.decode_points) >= 3
    assert full.num_points > quick.num_points
    # The full profile times chunks over cached contexts, within the same limits, and
    # every chunk of the prompts whose chunked slowdown it reports.
    prompt = full.chunk_prompt
    assert prompt == min(2048, engine.max_model_len - 1) and prompt in full.prefill_lengths
    for n, c in full.chunk_points:
        assert c > 0 and n <= engine.config.sched.max_batch_tokens
        assert n + c <= engine.max_model_len - 1
        assert engine.blocks.blocks_for(n + c) <= engine.blocks.device.num_blocks
    for k in CHUNK_SIZES:
        for n, c in chunk_series(prompt, k):
            assert (n, c) in full.chunk_points or (c == 0 and n in full.prefill_lengths)
    assert {(64, 512), (256, 512), (64, 1536), (256, 1536)} <= set(full.chunk_points)
    assert full.max_iterations >= full.num_samples * full.repeats
    assert full.prefill_lengths[0] == 16 and full.prefill_lengths[-1] == engine.max_model_len - 1


def test_calibrate_caches_a_json_profile(engine, tmp_path, monkeypatch):
    path = tmp_path / "sub" / "tiny.json"
    first = calibrate(engine, path)
    assert path.is_file()
    calls = _counting(monkeypatch, engine)
    again = calibrate(engine, path)
    assert calls[0] == 0  # loaded, not measured
    assert again == first
    assert "warning" not in again.notes


def test_calibrate_loads_shipped_names_and_warns_on_a_foreign_profile(engine, tmp_path):
    shipped = calibrate(engine, "opt-13b-a100")
    assert shipped.name == "opt-13b-a100"
    mine = calibrate(engine, None)
    data = json.loads(mine.to_json())
    data["notes"]["engine"]["model"] = "preset:opt-13b"
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps(data))
    assert "another model" in calibrate(engine, foreign).notes["warning"]
    with pytest.raises(ConfigError, match="opt-13b-a100"):
        calibrate(engine, "no-such-profile")


def test_run_profile_command_prints_and_writes(tmp_path):
    from rich.console import Console

    buf = io.StringIO()
    out = tmp_path / "prof" / "tiny.json"
    cost = run_profile_command(
        "tiny", out, quick=True, engine_options={"num_gpu_blocks": 256},
        console=Console(file=buf, width=140, force_terminal=False),
    )  # fmt: skip
    text = buf.getvalue()
    assert "measured vs fitted" in text and "decode" in text and "prefill" in text
    assert "q1 (min iteration)" in text and str(out) in text.replace("\n", "")
    flat = " ".join(text.split())
    assert "chunk(n, c) = prefill(n)" in flat
    assert "chunked prefill of 2047 tokens vs whole" in flat and "at chunk 512" in flat
    assert "prefill_per_ctx_token derived" in flat
    assert CostModel.load(out) == cost


def test_report_shows_the_measured_chunk_slowdown():
    from rich.console import Console

    truth = CostModel(
        prefill_per_token2=1e-9, prefill_per_ctx_token=3e-9, decode_per_ctx_token=2e-8
    )
    series = {p for k in (256, 512) for p in chunk_series(2048, k) if p[1]}
    pre = [PrefillSample(n, [truth.prefill_time(n)]) for n in (16, 256, 512, 2048)]
    dec = [DecodeSample(b, c, [truth.decode_time(b, b * c)]) for b in (1, 8) for c in (16, 512)]
    chk = [ChunkSample(n, c, [truth.chunk_time(n, c)]) for n, c in sorted(series)]
    cost = fit_cost_model(pre, dec, chk, name="synthetic")
    assert cost.prefill_per_ctx_token == pytest.approx(3e-9, rel=1e-6)
    line = chunk_report(cost)
    ratio = truth.chunked_prefill_time(2048, 512) / truth.prefill_time(2048)
    assert f"x{ratio:.2f} at chunk 512 (measured x{ratio:.2f})" in line
    assert "prefill_per_ctx_token measured (2 x prefill_per_token2 would be 2.0000 ns)" in line
    buf = io.StringIO()
    print_report(cost, Console(file=buf, width=200, force_terminal=False))
    text = " ".join(buf.getvalue().split())
    assert "256 over 1792 cached" in text and line in text
    assert chunk_report(CostModel()) == ""  # no notes: nothing to say


@pytest.mark.gpu
def test_quick_profile_on_cuda(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    eng = Engine(EngineConfig.from_kwargs(model="tiny", device="cuda", num_gpu_blocks=512))
    calls = _counting(monkeypatch, eng)
    cost = profile_engine(eng, quick=True)
    assert calls[0] == cost.notes["iterations"] <= QUICK_MAX_ITERATIONS
    assert eng.blocks.num_free == eng.blocks.device.num_blocks
    assert cost.name.startswith("tiny-cuda-")
    assert cost.notes["swap"]["method"].startswith("pinned")
    assert cost.decode_base > 0 and cost.swap_bytes_per_s > 1e9
    assert "gpu" in cost.notes["machine"]
