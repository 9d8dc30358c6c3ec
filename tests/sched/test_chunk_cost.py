"""The cost of chunked prefill: `CostModel.chunk_time` and friends, the measured
fit of `prefill_per_ctx_token`, and the term in the shipped analytic profiles."""

from __future__ import annotations

import json
import random

import pytest

from fsd.cost import CostModel
from fsd.cost.analytic import SHIPPED, derive_terms, shipped_profile
from fsd.cost.fit import (
    ChunkSample,
    DecodeSample,
    PrefillSample,
    chunk_series,
    chunk_slowdown,
    fit_chunk,
    fit_cost_model,
)
from fsd.cost.profiles import load_profile
from fsd.errors import ConfigError
from tests.costs import linear_cost

MEASURED_LIKE = linear_cost(
    "measured-like", prefill=(2e-3, 3e-5), decode=(5e-3, 2e-4, 3e-8),
    prefill_per_token2=4e-9, prefill_per_ctx_token=1.1e-8,
)  # fmt: skip


def _random_costs(count: int, seed: int = 7) -> list[CostModel]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        p2 = rng.choice([0.0, rng.uniform(1e-10, 1e-8)])
        out.append(
            CostModel(
                name=f"r{i}",
                prefill_base=rng.uniform(0, 2e-2),
                prefill_per_token=rng.uniform(0, 1e-4),
                prefill_per_token2=p2,
                prefill_per_ctx_token=2 * p2 * rng.uniform(1.0, 3.0),
                decode_base=rng.uniform(1e-3, 2e-2),
                decode_per_seq=rng.uniform(0, 1e-3),
                decode_per_ctx_token=rng.uniform(0, 1e-6),
            )
        )
    return out


COSTS = [load_profile(name) for name in sorted(SHIPPED)] + [MEASURED_LIKE, *_random_costs(20)]


# ---- the model's algebra ---------------------------------------------------------------


@pytest.mark.parametrize("cost", COSTS, ids=lambda c: c.name)
def test_a_chunk_over_nothing_is_the_prefill_exactly(cost):
    for n in (1, 2, 17, 256, 511, 2048):
        assert cost.chunk_time(n, 0) == cost.prefill_time(n)
        assert cost.chunked_prefill_time(n, 0) == cost.prefill_time(n)
        assert cost.chunked_prefill_time(n, n) == cost.prefill_time(n)


@pytest.mark.parametrize("cost", COSTS, ids=lambda c: c.name)
def test_iteration_time_without_cached_chunks_is_the_old_formula_bit_for_bit(cost):
    rng = random.Random(cost.name)
    for _ in range(50):
        lens = [rng.randint(2, 2048) for _ in range(rng.randint(0, 4))]
        ctx = [rng.randint(1, 4096) for _ in range(rng.randint(0, 32))]
        # whole prefills: the decode part (weights read once) plus each prefill beyond
        # its base; nothing cached adds nothing, to the last bit
        old = cost.iteration_time(lens, ctx)
        parts = (cost.decode_time(len(ctx), sum(ctx)) if ctx else cost.prefill_base) + sum(
            cost.prefill_time(n) - cost.prefill_base for n in lens
        )
        assert old == pytest.approx(parts if lens or ctx else 0.0, rel=1e-12)
        assert cost.iteration_time(lens, ctx, [0] * len(lens)) == old


def test_iteration_time_charges_each_chunks_cached_context():
    cost = MEASURED_LIKE
    lens, ctx, cached = [256, 100], [300, 40], [512, 0]
    extra = 512 * (cost.decode_per_ctx_token + cost.prefill_per_ctx_token * 256)
    assert cost.iteration_time(lens, ctx, cached) == pytest.approx(
        cost.iteration_time(lens, ctx) + extra, rel=1e-15
    )
    # A chunk alone costs its chunk_time; the job's next iteration says the same.
    assert cost.iteration_time([256], [], [512]) == pytest.approx(cost.chunk_time(256, 512))
    assert cost.job_iteration_time(256, 768) == cost.chunk_time(256, 512)


@pytest.mark.parametrize("cost", COSTS, ids=lambda c: c.name)
def test_chunked_prefill_is_never_faster_than_whole(cost):
    # (prefill_per_ctx_token >= 2 x prefill_per_token2 in every cost here: a chunk
    # attends each cached token at least as dearly as the causal whole prefill does)
    for prompt in (2, 100, 513, 2048, 4000):
        whole = cost.prefill_time(prompt)
        for chunk in (1, 16, 64, 256, 512, 1024):
            chunked = cost.chunked_prefill_time(prompt, chunk)
            assert chunked >= whole * (1 - 1e-12), (prompt, chunk)
            series = chunk_series(prompt, chunk)
            assert sum(n for n, _ in series) == prompt
            assert chunked == pytest.approx(sum(cost.chunk_time(n, c) for n, c in series))


@pytest.mark.parametrize("cost", COSTS, ids=lambda c: c.name)
def test_the_attention_pairs_telescope(cost):
    # per_ctx = 2 x per_token2: sum n_i^2 + 2 sum n_i c_i = P^2, so a chunked prompt
    # costs the whole one plus a base per extra chunk plus re-reading the cached KV.
    exact = CostModel(
        prefill_base=cost.prefill_base,
        prefill_per_token=cost.prefill_per_token,
        prefill_per_token2=cost.prefill_per_token2,
        prefill_per_ctx_token=2 * cost.prefill_per_token2,
        decode_per_ctx_token=cost.decode_per_ctx_token,
    )
    bare = CostModel(
        prefill_base=0.0,
        prefill_per_token=cost.prefill_per_token,
        prefill_per_token2=cost.prefill_per_token2,
        prefill_per_ctx_token=2 * cost.prefill_per_token2,
        decode_per_ctx_token=0.0,
    )
    for prompt in (2, 100, 513, 2048, 4000):
        for chunk in (1, 16, 256, 512, 1024):
            series = chunk_series(prompt, chunk)
            reread = exact.decode_per_ctx_token * sum(c for _, c in series)
            assert exact.chunked_prefill_time(prompt, chunk) == pytest.approx(
                exact.prefill_time(prompt) + (len(series) - 1) * exact.prefill_base + reread,
                rel=1e-12,
            )
            assert bare.chunked_prefill_time(prompt, chunk) == pytest.approx(
                bare.prefill_time(prompt), rel=1e-12, abs=1e-18
            )


def test_chunk_series():
    assert chunk_series(2047, 512) == [(512, 0), (512, 512), (512, 1024), (511, 1536)]
    assert chunk_series(600, 256) == [(256, 0), (256, 256), (88, 512)]
    assert chunk_series(100, 0) == chunk_series(100, 100) == chunk_series(100, 500) == [(100, 0)]


# ---- JSON: the field is optional, and checked ------------------------------------------


def test_old_json_without_the_field_loads_with_zero(tmp_path):
    data = json.loads(MEASURED_LIKE.to_json())
    del data["prefill_per_ctx_token"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    old = CostModel.load(path)
    assert old.prefill_per_ctx_token == 0.0
    assert old.prefill_time(300) == MEASURED_LIKE.prefill_time(300)
    # Without the term a chunk costs its prefill plus re-reading the cached KV.
    assert old.chunk_time(256, 512) == old.prefill_time(256) + 512 * old.decode_per_ctx_token


@pytest.mark.parametrize("value", [-1e-12, float("nan")])
def test_a_negative_per_ctx_term_is_refused_by_name(tmp_path, value):
    with pytest.raises(ConfigError, match="prefill_per_ctx_token"):
        CostModel(prefill_per_ctx_token=value)
    data = json.loads(MEASURED_LIKE.to_json()) | {"prefill_per_ctx_token": -1e-9}
    path = tmp_path / "neg.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="prefill_per_ctx_token"):
        CostModel.load(path)


# ---- the measured fit --------------------------------------------------------------------


def _synthetic(cost: CostModel, chunks: list[tuple[int, int]]):
    pre = [PrefillSample(n, [cost.prefill_time(n)] * 3) for n in (16, 64, 256, 512, 1024, 2048)]
    dec = [
        DecodeSample(b, c, [cost.decode_time(b, b * c)] * 3) for b in (1, 4, 16) for c in (16, 512)
    ]
    chk = [ChunkSample(n, c, [cost.chunk_time(n, c)] * 3) for n, c in chunks]
    return pre, dec, chk


GRID = [(n, c) for n in (64, 256, 512) for c in (512, 1536)]


@pytest.mark.parametrize("per_ctx", [0.0, 2.5e-9, 8e-9, 3e-8])
def test_the_fit_recovers_a_known_per_ctx_term(per_ctx):
    truth = CostModel(**{**_fields(MEASURED_LIKE), "prefill_per_ctx_token": per_ctx})
    pre, dec, chk = _synthetic(truth, GRID)
    fitted = fit_cost_model(pre, dec, chk, name="synthetic")
    assert fitted.prefill_per_ctx_token == pytest.approx(per_ctx, rel=1e-6, abs=1e-18)
    assert fitted.prefill_base == pytest.approx(truth.prefill_base, rel=1e-6)
    assert fitted.decode_per_ctx_token == pytest.approx(truth.decode_per_ctx_token, rel=1e-6)
    assert fitted.notes["fit"]["chunk"]["max_abs_rel"] < 1e-6
    assert len(fitted.notes["chunk"]) == len(GRID)
    info = fitted.notes["chunked_prefill"]
    assert info["prefill_per_ctx_token"].startswith("measured")
    assert info["derived_prefill_per_ctx_token"] == 2 * fitted.prefill_per_token2


def test_the_fit_clips_at_zero_and_refuses_no_chunks():
    truth = MEASURED_LIKE
    pre, dec, _ = _synthetic(truth, [])
    # Chunks faster than their prefill + KV re-read: nothing is left for the pairs.
    fast = [ChunkSample(n, c, [0.9 * truth.prefill_time(n)]) for n, c in GRID]
    assert fit_chunk(fast, truth) == 0.0
    with pytest.raises(ConfigError, match="chunk"):
        fit_chunk([ChunkSample(256, 0, [0.01])], truth)


def test_without_chunks_the_term_is_derived_and_the_notes_say_so():
    pre, dec, _ = _synthetic(MEASURED_LIKE, [])
    cost = fit_cost_model(pre, dec, name="quick", chunk_prompt=2047)
    assert cost.prefill_per_ctx_token == 2 * cost.prefill_per_token2
    info = cost.notes["chunked_prefill"]
    assert info["prefill_per_ctx_token"].startswith("derived")
    assert info["prompt_tokens"] == 2047
    assert set(info["slowdown"]) == {"256", "512"}
    for size, ratio in info["slowdown"].items():
        assert "measured" not in ratio
        assert ratio["predicted"] == cost.chunked_prefill_time(2047, int(size)) / (
            cost.prefill_time(2047)
        )
        assert ratio["predicted"] > 1
    assert cost.notes["chunk"] == []
    json.loads(cost.to_json())
    # Chunks over nothing (prefills) measure no pairs: still derived.
    over_nothing = [ChunkSample(n, 0, [MEASURED_LIKE.prefill_time(n)]) for n in (64, 256)]
    again = fit_cost_model(pre, dec, over_nothing)
    assert again.prefill_per_ctx_token == 2 * again.prefill_per_token2
    assert again.notes["chunked_prefill"]["prefill_per_ctx_token"].startswith("derived")


def test_measured_slowdown_from_the_chunks_of_the_prompt():
    prompt = 2047
    series = {p for k in (256, 512) for p in chunk_series(prompt, k) if p[1]}
    pre, dec, chk = _synthetic(MEASURED_LIKE, sorted(series | set(GRID)))
    pre.append(PrefillSample(prompt, [MEASURED_LIKE.prefill_time(prompt)]))
    cost = fit_cost_model(pre, dec, chk, chunk_prompt=prompt)
    for ratio in cost.notes["chunked_prefill"]["slowdown"].values():
        # exact data: what was measured is what the fitted model predicts
        assert ratio["measured"] == pytest.approx(ratio["predicted"], rel=1e-6)
    # A series with a chunk missing has no measured ratio.
    times = {(n, c): MEASURED_LIKE.chunk_time(n, c) for n, c in chunk_series(prompt, 512)}
    times[(prompt, 0)] = MEASURED_LIKE.prefill_time(prompt)
    got = chunk_slowdown(MEASURED_LIKE, prompt, (256, 512), times)
    assert "measured" not in got["256"] and "measured" in got["512"]
    del times[(prompt, 0)]  # nor without the whole prefill to compare with
    assert "measured" not in chunk_slowdown(MEASURED_LIKE, prompt, (512,), times)["512"]


def _fields(cost: CostModel) -> dict:
    data = json.loads(cost.to_json())
    data.pop("notes")
    return data


# ---- the analytic profiles ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_analytic_term_is_the_pairs_attention_math(name):
    model, gpu, tp, pp = SHIPPED[name]
    cost = shipped_profile(name)
    terms = derive_terms(model, gpu, tp, pp)
    assert cost.prefill_per_ctx_token == terms.prefill_per_ctx_token == 2 * terms.per_token2
    assert cost.prefill_per_ctx_token == 2 * cost.prefill_per_token2
    points = cost.notes["reference_points_s"]
    for chunk in (256, 512):
        got = points[f"prefill_2048_chunk{chunk}"]
        assert got == cost.chunked_prefill_time(2048, chunk)
        assert cost.prefill_time(2048) < got < 1.7 * cost.prefill_time(2048)
    assert points["prefill_2048_chunk256"] > points["prefill_2048_chunk512"]
