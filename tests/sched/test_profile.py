"""CostModel persistence and validation; the analytic profiles and their README's claims."""

from __future__ import annotations

import json

import pytest

from fsd.cost import CostModel
from fsd.cost.analytic import (
    SHIPPED,
    analytic_profile,
    derive_terms,
    roofline_decode_time,
    shipped_profile,
    write_shipped_profiles,
)
from fsd.cost.hardware import GPUS, MODELS, shape_from_arch
from fsd.cost.profiles import load_profile, profile_path, shipped_profiles
from fsd.errors import ConfigError
from tests.import_graph import loads

MS = 1e-3

# ---- CostModel: JSON round trip and validation -------------------------------------


def test_json_round_trip_keeps_every_field_and_the_notes(tmp_path):
    cost = CostModel(
        name="rt",
        prefill_base=1.5e-3,
        prefill_per_token=2.25e-5,
        prefill_per_token2=3e-9,
        prefill_per_ctx_token=7e-9,
        decode_base=4e-3,
        decode_per_seq=5e-5,
        decode_per_ctx_token=6e-8,
        kv_bytes_per_token=4096,
        swap_bytes_per_s=2.5e10,
        notes={"points": [[16, 0.001]], "machine": {"cpu": "x"}},
    )
    path = tmp_path / "p.json"
    cost.save(path)
    back = CostModel.load(path)
    assert back == cost
    assert back.notes == cost.notes
    assert CostModel.from_dict(json.loads(cost.to_json())) == cost


def test_unknown_field_is_named(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"name": "x", "decode_bse": 1.0}))
    with pytest.raises(ConfigError, match="decode_bse"):
        CostModel.load(path)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("prefill_base", -1e-6),
        ("prefill_per_token2", -1e-6),
        ("prefill_per_ctx_token", -1e-9),
        ("decode_per_ctx_token", -1e-6),
        ("decode_base", float("nan")),
        ("kv_bytes_per_token", -2),
    ],
)
def test_negative_coefficient_is_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        CostModel(**{key: value})


def test_zero_swap_bandwidth_is_refused():
    with pytest.raises(ConfigError, match="swap_bytes_per_s"):
        CostModel(swap_bytes_per_s=0)


def test_bad_json_file_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json"):
        CostModel.load(path)
    arr = tmp_path / "array.json"
    arr.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="array.json"):
        CostModel.load(arr)
    with pytest.raises(ConfigError, match="missing.json"):
        CostModel.load(tmp_path / "missing.json")


# ---- loading shipped profiles ----------------------------------------------------------


def test_every_shipped_profile_loads_by_name():
    assert shipped_profiles() == sorted(SHIPPED)
    for name in SHIPPED:
        cost = load_profile(name)
        assert cost.name == name
        assert profile_path(name).name == f"{name}.json"


def test_shipped_files_are_what_the_code_derives(tmp_path):
    # The JSON files must not drift from analytic.py: regenerate and compare.
    for path in write_shipped_profiles(tmp_path):
        fresh = CostModel.load(path)
        shipped = load_profile(path.stem)
        assert shipped == fresh
        assert shipped.notes == fresh.notes


def test_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(ConfigError) as err:
        load_profile("opt-99b-a100")
    msg = str(err.value)
    assert "opt-99b-a100" in msg
    for name in SHIPPED:
        assert name in msg


def test_profile_loads_by_path(tmp_path):
    path = tmp_path / "mine.json"
    CostModel(name="mine", decode_base=2e-3).save(path)
    assert load_profile(str(path)).decode_base == 2e-3
    assert load_profile(path).name == "mine"
    with pytest.raises(ConfigError, match="nothere.json"):
        load_profile(str(tmp_path / "nothere.json"))


def test_the_cost_package_imports_no_torch():
    cost = ("analytic", "profiles", "fit", "calibration", "stages")
    assert not loads("torch", "fsd.cost", *(f"fsd.cost.{m}" for m in cost))


# ---- analytic profiles: shape, monotonicity ------------------------------------------------


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_profiles_are_monotone(name):
    cost = load_profile(name)
    lengths = [1, 16, 128, 512, 1024, 2048]
    pre = [cost.prefill_time(n) for n in lengths]
    assert all(b > a for a, b in zip(pre, pre[1:], strict=False))
    batches = [1, 2, 4, 8, 16, 32, 64]
    dec_b = [cost.decode_time(b, b * 512) for b in batches]
    assert all(b > a for a, b in zip(dec_b, dec_b[1:], strict=False))
    dec_c = [cost.decode_time(8, 8 * c) for c in (1, 64, 512, 2048)]
    assert all(b > a for a, b in zip(dec_c, dec_c[1:], strict=False))
    assert cost.decode_time(16, 0) > cost.decode_time(1, 0) > 0
    for key in ("prefill_base", "prefill_per_token", "prefill_per_token2", "decode_base",
                "decode_per_seq", "decode_per_ctx_token"):  # fmt: skip
        assert getattr(cost, key) > 0
    # Prefill of n tokens costs at least one decode step, and q1 is a decode step.
    assert cost.prefill_time(16) >= cost.decode_time(1, 16) * 0.99
    assert cost.min_iteration_time == cost.decode_time(1, 1)


def test_opt_shapes_have_their_published_sizes():
    assert MODELS["opt-13b"].num_params == pytest.approx(13e9, rel=0.02)
    assert MODELS["opt-66b"].num_params == pytest.approx(66e9, rel=0.02)
    assert MODELS["opt-175b"].num_params == pytest.approx(175e9, rel=0.01)
    # The paper's 4*l*h bytes of KV per token (fp16).
    for name in ("opt-13b", "opt-66b", "opt-175b"):
        s = MODELS[name]
        assert s.kv_bytes_per_token() == 4 * s.num_layers * s.hidden_size


def test_shape_from_arch_matches_the_preset():
    from fsd.models.presets import get_preset

    arch = get_preset("opt-13b").arch
    shape = shape_from_arch("opt-13b", arch)
    assert shape.layer_params == MODELS["opt-13b"].layer_params
    assert shape.kv_bytes_per_token(2) == arch.kv_bytes_per_token("float16")
    llama = shape_from_arch("llama-1b", get_preset("llama-1b").arch)
    assert llama.gated_mlp and llama.kv_heads == 8
    assert llama.kv_bytes_per_token(2) == get_preset("llama-1b").arch.kv_bytes_per_token("float16")
    assert analytic_profile(llama, "h100").decode_base > 0


def test_any_layout_and_its_limits():
    cost = analytic_profile("opt-175b", "a100", tp=8, pp=2)
    assert cost.notes["layout"] == {"tp": 8, "pp": 2, "num_gpus": 16, "dtype_bytes": 2}
    assert "16 x a100" in str(cost.notes["gpus"])
    # Pipeline stages do not shorten an iteration's latency; they add hop latency.
    tp8 = load_profile("opt-175b-a100")
    assert cost.decode_time(1, 1) >= tp8.decode_time(1, 1)
    # Twice the host links: half the swap time.
    assert cost.swap_time(513) == pytest.approx(tp8.swap_time(513) / 2)
    with pytest.raises(ConfigError, match="GB of weights per GPU"):
        analytic_profile("opt-175b", "a100-40gb", tp=8)  # 43.6 GB > 36 GB usable
    with pytest.raises(ConfigError, match="across nodes"):
        analytic_profile("opt-175b", "a100", tp=16)
    with pytest.raises(ConfigError, match="known"):
        analytic_profile("opt-1t", "a100")
    with pytest.raises(ConfigError, match="known"):
        analytic_profile("opt-13b", "tpu")


def test_more_tp_means_faster_steps():
    one, two, four = (analytic_profile("opt-13b", "a100", tp=t) for t in (1, 2, 4))
    assert one.decode_time(1, 1) > two.decode_time(1, 1) > four.decode_time(1, 1)
    assert one.prefill_time(2048) > two.prefill_time(2048) > four.prefill_time(2048)


def test_additive_model_sits_above_the_roofline_floor():
    # OPT's bound; the Llama profiles' (more latency terms) is in test_llama_profiles.py
    for name, (model, gpu, tp, pp) in SHIPPED.items():
        if not model.startswith("opt"):
            continue
        cost = load_profile(name)
        for b, ctx in ((1, 1), (16, 16 * 1024), (64, 64 * 512)):
            floor = roofline_decode_time(model, gpu, b, ctx, tp=tp, pp=pp)
            assert floor < cost.decode_time(b, ctx) < 2 * floor, (name, b, ctx)


# ---- the README's numbers -------------------------------------------------------------

# (q1, prefill 512, prefill 2048, decode b=1 ctx 1k, decode b=16 ctx 1k each, swap 513) in ms
README_TABLE = {
    "opt-13b-a100": (17.09, 86.62, 302.50, 17.62, 27.62, 16.81),
    "opt-13b-h100": (10.54, 36.92, 118.81, 10.85, 16.36, 8.40),
    "opt-66b-a100": (23.78, 121.45, 419.98, 24.16, 32.75, 12.10),
    "opt-66b-h100": (14.75, 54.08, 174.18, 14.98, 19.54, 6.05),
    "opt-175b-a100": (31.89, 169.95, 589.89, 32.27, 42.03, 12.10),
    "opt-175b-h100": (19.78, 77.49, 252.83, 20.00, 25.10, 6.05),
}


def _row(cost: CostModel) -> tuple[float, ...]:
    return tuple(
        round(t / MS, 2)
        for t in (
            cost.min_iteration_time,
            cost.prefill_time(512),
            cost.prefill_time(2048),
            cost.decode_time(1, 1024),
            cost.decode_time(16, 16 * 1024),
            cost.swap_time(513),
        )
    )


@pytest.mark.parametrize("name", sorted(README_TABLE))
def test_readme_table(name):
    assert _row(load_profile(name)) == README_TABLE[name]


def _readme_section(title: str) -> list[str]:
    text = (profile_path("opt-13b-a100").parent / "README.md").read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return section.splitlines()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_readme_chunked_prefill_table(name):
    # | profile | prefill 2048 | chunks of 256 (xR) | chunks of 512 (xR) | KV re-read 256 | 512 |
    rows = {
        cells[0]: cells[1:]
        for line in _readme_section("Chunked prefill")
        if line.startswith(("| opt-", "| llama"))
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    cost = load_profile(name)
    whole = cost.prefill_time(2048)
    want = [f"{whole / MS:.2f}"]
    for k in (256, 512):
        chunked = cost.chunked_prefill_time(2048, k)
        want.append(f"{chunked / MS:.2f} (x{chunked / whole:.2f})")
    for k in (256, 512):
        reread = sum(range(0, 2048, k))  # the cached tokens each chunk reads, summed
        want.append(f"{cost.decode_per_ctx_token * reread / MS:.2f}")
    assert rows[name] == want


def test_paper_layout_row_and_a100_40gb_steps():
    paper = analytic_profile("opt-175b", "a100-40gb", tp=8, pp=2)
    assert _row(paper) == (39.73, 178.17, 599.29, 40.21, 51.61, 6.05)
    # The paper's three setups on A100-40GB; its SLO of 0.3 s = 10 steps implies ~30 ms.
    assert round(analytic_profile("opt-13b", "a100-40gb").min_iteration_time / MS, 1) == 21.7
    assert round(analytic_profile("opt-66b", "a100-40gb", tp=4).min_iteration_time / MS, 1) == 29.7


def test_paper_sanity_kv_decode_and_swap():
    opt175 = MODELS["opt-175b"]
    job_bytes = 513 * opt175.kv_bytes_per_token()
    assert job_bytes == pytest.approx(2.42e9, rel=0.01)  # the paper's "2.3 GB" (2.25 GiB)
    assert job_bytes / 2**30 == pytest.approx(2.25, abs=0.01)
    # Decode: "about 60 ms" on 16 A100s -- ours within a factor of 2, and below it.
    paper = analytic_profile("opt-175b", "a100-40gb", tp=8, pp=2)
    shipped = load_profile("opt-175b-a100")
    for cost in (paper, shipped):
        for t in (cost.decode_time(1, 1024), cost.decode_time(16, 16 * 1024)):
            assert 30 * MS <= t < 60 * MS
    # Swap: the paper's 36 ms is 2.3 GB over one x16 link at 64 GB/s (both directions).
    paper_swap = 2.3e9 / 64e9
    assert paper_swap == pytest.approx(36 * MS, rel=0.01)
    # Ours: one direction at 25 GB/s per link, every GPU its own link.
    assert job_bytes / GPUS["a100"].pcie_bytes_per_s == pytest.approx(97 * MS, rel=0.01)
    assert shipped.swap_time(513) == pytest.approx(12.1 * MS, rel=0.01)
    assert paper.swap_time(513) == pytest.approx(6.05 * MS, rel=0.01)
    # A swap is a sizeable fraction of a decode step, hence proactive overlapping.
    assert 0.2 < shipped.swap_time(513) / shipped.decode_time(1, 513) < 0.6


def test_h100_against_a100():
    for model in ("opt-13b", "opt-66b", "opt-175b"):
        a, h = load_profile(f"{model}-a100"), load_profile(f"{model}-h100")
        decode = h.decode_time(1, 1024) / a.decode_time(1, 1024)
        prefill = h.prefill_time(2048) / a.prefill_time(2048)
        assert 0.55 < decode < 0.7  # bandwidth-bound: ~2.0 / 3.35
        assert 0.35 < prefill < 0.5  # compute-bound
        assert h.swap_bytes_per_s == 2 * a.swap_bytes_per_s  # PCIe 5.0 vs 4.0


def test_weight_read_term_is_the_bandwidth_bound():
    t = derive_terms("opt-13b", "a100")
    weights = MODELS["opt-13b"].num_layers * MODELS["opt-13b"].layer_params + 50272 * 5120
    assert t.weight_read == pytest.approx(weights * 2 / (2.0e12 * 0.8))
    assert t.weight_read == pytest.approx(16.05 * MS, rel=1e-3)
    assert derive_terms("opt-13b", "a100").per_seq_comm == 0.0  # no TP, no collectives
    assert derive_terms("opt-66b", "a100", tp=4).per_seq_comm > 0


def test_shipped_profile_notes_state_the_gpus():
    expected = {"opt-13b": 1, "opt-66b": 4, "opt-175b": 8}  # GPUs per pipeline stage
    for name, (model, _gpu, tp, pp) in SHIPPED.items():
        notes = shipped_profile(name).notes
        per_stage = expected.get(model, tp)  # the Llama profiles ship at several TPs
        assert notes["layout"]["num_gpus"] == per_stage * pp == tp * pp
        assert f"{per_stage * pp} x" in str(notes["gpus"])
        assert notes["kv_capacity_tokens"] > 10_000


@pytest.mark.parametrize("name", ["opt-13b-a100", "opt-175b-a100-tp8pp2"])
def test_decode_line_is_the_one_job_decode_step_bit_for_bit(name):
    from fsd.cost.profiles import load_profile

    cost = load_profile(name)
    a, b = cost.decode_line()
    for ctx in (1, 17, 999, 2047):
        assert a + b * ctx == cost.job_iteration_time(1, ctx) == cost.decode_time(1, ctx)
