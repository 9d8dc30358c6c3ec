"""The Llama 3.1 analytic profiles (GQA, SwiGLU, untied head, 128k context, H100/H200,
TP 4/8), and the OPT profiles pinned so that extending the model did not move them."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from fsd.config import CacheConfig, SchedConfig
from fsd.cost import CostModel
from fsd.cost.analytic import (
    ACTIVATION_TOKENS,
    GPU_MEMORY_UTILIZATION,
    SHIPPED,
    analytic_profile,
    derive_terms,
    plan_stages,
    roofline_decode_time,
    shipped_profile,
)
from fsd.cost.hardware import GPUS, MODELS, shape_from_arch
from fsd.cost.profiles import load_profile, profile_path, shipped_profiles
from fsd.errors import ConfigError
from fsd.sim.capacity import HOST_TO_DEVICE, kv_capacity_tokens, max_context_of, size_pools

MS = 1e-3
LLAMA = {
    "llama3.1-8b-h100": ("llama3.1-8b", "h100", 1),
    "llama3.1-8b-h200": ("llama3.1-8b", "h200", 1),
    "llama3.1-70b-h100-tp4": ("llama3.1-70b", "h100", 4),
    "llama3.1-70b-h100-tp8": ("llama3.1-70b", "h100", 8),
    "llama3.1-70b-h200-tp4": ("llama3.1-70b", "h200", 4),
    "llama3.1-70b-h200-tp8": ("llama3.1-70b", "h200", 8),
}


def _blocks(cost: CostModel) -> int:
    return size_pools(cost, CacheConfig(block_size=16)).device


# ---- shipped, loadable, listed ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LLAMA))
def test_each_llama_profile_ships_and_loads(name):
    model, gpu, tp = LLAMA[name]
    assert SHIPPED[name] == (model, gpu, tp, 1)
    assert name in shipped_profiles()
    cost = load_profile(name)
    assert cost.name == name and profile_path(name).name == f"{name}.json"
    assert cost == shipped_profile(name)  # the JSON is what the code derives
    assert cost.notes["layout"] == {"tp": tp, "pp": 1, "num_gpus": tp, "dtype_bytes": 2}
    assert cost.pipeline_stages == 1
    assert cost.swap_bytes_per_s == tp * GPUS[gpu].pcie_bytes_per_s  # every GPU its link
    assert max_context_of(cost) == 131072  # nothing clipped below 128k


def test_an_unknown_name_lists_the_llama_profiles():
    with pytest.raises(ConfigError) as err:
        load_profile("llama3.1-405b-h100")
    for name in LLAMA:
        assert name in str(err.value)


def test_simulate_runs_on_a_llama_profile_at_its_128k_context(tmp_path):
    from fsd.cli import app

    out = tmp_path / "sim.json"
    args = ["simulate", "--profile", "llama3.1-8b-h100", "--limit", "40", "--rate", "2",
            "--policies", "fcfs", "--json", str(out)]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["profile"] == "llama3.1-8b-h100" and data["max_context"] == 131072
    assert data["policies"]["fcfs"]["requests"] == 40


# ---- the shapes: GQA, SwiGLU, untied head ------------------------------------------------


def test_llama_shapes_have_their_published_sizes():
    small, big = MODELS["llama3.1-8b"], MODELS["llama3.1-70b"]
    assert small.num_params == pytest.approx(8.03e9, rel=0.002)
    assert big.num_params == pytest.approx(70.55e9, rel=0.002)
    # GQA: K and V of 8 heads x 128, not of the 32 (64) query heads
    assert small.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072
    assert big.kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2 == 327680
    assert load_profile("llama3.1-8b-h100").kv_bytes_per_token == 131072
    # SwiGLU: gate, up and down; q and o are h x h, k and v h x 1024
    h, f = 4096, 14336
    assert small.layer_matmul_params == 2 * h * h + 2 * h * 1024 + 3 * h * f
    assert small.layer_params == small.layer_matmul_params + 2 * h  # two RMSNorm weights
    # RoPE: no position table; untied: the LM head is counted beside the token table
    assert small.embedding_params == 128256 * h
    assert small.num_params == 32 * small.layer_params + 2 * 128256 * h


def test_attention_math_uses_query_heads_and_kv_reads_use_kv_heads():
    t = derive_terms("llama3.1-8b", "h100")
    g = GPUS["h100"]
    flops = g.peak_flops * g.compute_efficiency
    hbm = g.hbm_bytes_per_s * g.memory_efficiency
    assert t.per_token2 == pytest.approx(2 * 32 * 32 * 128 / flops)
    assert t.per_ctx_token == pytest.approx(131072 / hbm + 4 * 32 * 32 * 128 / flops)
    assert t.kv_write_per_token == pytest.approx(131072 / hbm)
    # TP shards both: a 70B GPU at TP 8 holds one KV head of each layer
    tp8 = plan_stages("llama3.1-70b", "h100", tp=8)[0]
    assert tp8.kv_bytes_per_token_per_gpu == 327680 / 8


def test_the_untied_head_is_stored_and_the_tied_opt_table_once():
    for name in ("llama3.1-8b", "opt-13b"):
        shape = MODELS[name]
        (stage,) = plan_stages(name, "h100")
        assert stage.weights_bytes_per_gpu == shape.num_params * 2
    (stage,) = plan_stages("llama3.1-70b", "h100", tp=4)
    assert stage.weights_bytes_per_gpu == MODELS["llama3.1-70b"].num_params * 2 / 4


def test_tp_all_reduces_are_charged():
    tp4, tp8 = (derive_terms("llama3.1-70b", "h100", tp=t) for t in (4, 8))
    assert tp4.per_seq_comm > 0 and tp8.per_seq_comm > tp4.per_seq_comm  # 2(t-1)/t grows
    assert (
        tp4.fixed_overhead
        == tp8.fixed_overhead
        == pytest.approx(
            80 * 10e-6 + 160 * 10e-6 + 0.5e-3  # launch gaps, 2 all-reduces a layer, host step
        )
    )


def test_kv_heads_must_split_across_tp():
    four_kv = dataclasses.replace(MODELS["llama3.1-8b"], num_kv_heads=4)
    assert analytic_profile(four_kv, "h100", tp=4).decode_base > 0
    with pytest.raises(ConfigError, match="KV heads"):
        analytic_profile(four_kv, "h100", tp=8)


def test_shape_from_a_llama_arch_has_no_position_table_and_rms_norms():
    from fsd.models.presets import get_preset

    arch = get_preset("llama-1b").arch
    shape = shape_from_arch("llama-1b", arch)
    assert shape.rms_norm and not shape.learned_positions and shape.tied_embeddings
    assert shape.embedding_params == arch.vocab_size * arch.hidden_size
    assert not shape_from_arch("untied", arch.replace(tie_word_embeddings=False)).tied_embeddings


# ---- memory: KV room after weights and the activation reserve --------------------------------


@pytest.mark.parametrize("name", sorted(LLAMA))
def test_kv_room_is_memory_minus_weights_minus_activations(name):
    model, gpu, tp = LLAMA[name]
    cost, shape = load_profile(name), MODELS[model]
    reserve = ACTIVATION_TOKENS * shape.activation_bytes_per_token(tp)
    assert cost.notes["activation_reserve_bytes_per_gpu"] == reserve > 0
    weights = shape.num_params * 2 / tp
    budget = GPUS[gpu].memory_bytes * GPU_MEMORY_UTILIZATION
    room = (budget - weights - reserve) * tp / shape.kv_bytes_per_token(2)
    assert abs(cost.notes["kv_capacity_tokens"] - room) < 1  # (floored)
    pools = size_pools(cost, CacheConfig(block_size=16))
    assert pools.device == cost.notes["kv_capacity_tokens"] // 16
    assert pools.host == HOST_TO_DEVICE * pools.device
    assert cost.notes["kv_capacity_tokens"] > 131072  # a whole 128k context fits


def test_activation_reserve_follows_the_scheduler_default_and_the_mlp():
    assert SchedConfig().max_batch_tokens == ACTIVATION_TOKENS
    # residual + normed copy + gate, up and their product, bf16
    assert MODELS["llama3.1-8b"].activation_bytes_per_token(1) == (2 * 4096 + 3 * 14336) * 2
    assert MODELS["llama3.1-70b"].activation_bytes_per_token(8) == (2 * 8192 + 3 * 3584) * 2


def test_capacity_fallback_subtracts_the_reserve():
    notes = {
        "gpu": {"memory_bytes": 80e9},
        "weights_bytes_per_gpu": 16e9,
        "activation_reserve_bytes_per_gpu": 2e9,
        "layout": {"num_gpus": 1},
    }
    cost = CostModel(name="m", kv_bytes_per_token=131072, notes=notes)
    tokens, _ = kv_capacity_tokens(cost, 0.9) or (0, "")
    assert tokens == int((80e9 * 0.9 - 16e9 - 2e9) / 131072)


# ---- the comparisons the profiles must get right ---------------------------------------------


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_70b_tp8_decodes_faster_than_tp4(gpu):
    tp4, tp8 = load_profile(f"llama3.1-70b-{gpu}-tp4"), load_profile(f"llama3.1-70b-{gpu}-tp8")
    for b, ctx in ((1, 1), (1, 2048), (32, 32 * 2048), (128, 128 * 4096)):
        assert tp8.decode_time(b, ctx) < tp4.decode_time(b, ctx)
    assert tp8.prefill_time(2048) < tp4.prefill_time(2048)
    assert _blocks(tp8) > _blocks(tp4)  # half the weights per GPU, twice the GPUs


@pytest.mark.parametrize("model", ["llama3.1-8b", "llama3.1-70b-{}-tp4", "llama3.1-70b-{}-tp8"])
def test_h200_decodes_no_slower_and_holds_more_kv_than_h100(model):
    name = model if "{}" in model else model + "-{}"
    h100, h200 = load_profile(name.format("h100")), load_profile(name.format("h200"))
    for b, ctx in ((1, 1), (32, 32 * 2048), (64, 64 * 8192)):
        assert h200.decode_time(b, ctx) <= h100.decode_time(b, ctx)
    # decode is bandwidth-bound: the 1.43x faster HBM shows; prefill is compute-bound
    assert h200.min_iteration_time < 0.85 * h100.min_iteration_time
    assert h200.prefill_time(8192) == pytest.approx(h100.prefill_time(8192), rel=0.05)
    assert _blocks(h200) > _blocks(h100)


def test_8b_prefill_of_2048_tokens_is_a_plausible_fraction_of_peak():
    cost = load_profile("llama3.1-8b-h100")
    flops = 2 * 8.03e9 * 2048
    ideal = flops / 989e12  # 100 % of the tensor cores: ~33 ms
    assert ideal < cost.prefill_time(2048) < ideal / 0.2  # MFU between 20 % and 100 %
    assert 20 * MS < cost.prefill_time(2048) < 200 * MS


@pytest.mark.parametrize("name", sorted(LLAMA))
def test_additive_steps_sit_between_the_roofline_and_its_efficiency_bound(name):
    model, gpu, tp = LLAMA[name]
    cost, t, g = load_profile(name), derive_terms(model, gpu, tp=tp), GPUS[gpu]
    # each term runs at an achievable fraction of its peak, and they add: at most
    # (1/e_mem + 1/e_flop) x the max() floor, plus the latencies the floor leaves out
    slack = 1 / g.memory_efficiency + 1 / g.compute_efficiency
    for b, ctx in ((1, 1), (16, 16 * 1024), (64, 64 * 512)):
        floor = roofline_decode_time(model, gpu, b, ctx, tp=tp)
        step = cost.decode_time(b, ctx)
        assert floor < step < slack * floor + t.fixed_overhead + b * t.per_seq_comm


@pytest.mark.parametrize("name", sorted(LLAMA))
def test_readme_row(name):
    text = (profile_path(name).parent / "README.md").read_text()
    section = text.split("## The shipped numbers\n", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith(f"| {name} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    cost = load_profile(name)
    times = (cost.min_iteration_time, cost.prefill_time(512), cost.prefill_time(2048),
             cost.decode_time(1, 1024), cost.decode_time(16, 16 * 1024), cost.swap_time(513))  # fmt: skip
    assert cells[2:8] == [f"{x / MS:.2f}" for x in times]
    assert cells[9] == f"{cost.notes['kv_capacity_tokens']:,}"


# ---- the OPT profiles did not move -------------------------------------------------------------

# Their CostModel fields before GQA/SwiGLU/untied heads/activation reserves were modelled.
OPT_PINNED = {
    "opt-13b-a100": (0.016956458721367522, 0.00013494482051282052, 2.188034188034188e-09,
                     0.0169537088, 0.00013769474188034188, 5.163760683760684e-07, 819200,
                     25e9, 56510),
    "opt-13b-h100": (0.010485344782993828, 5.119712563572431e-05, 8.283114256825076e-10,
                     0.01048430376119403, 5.223814743552209e-05, 3.073282646424098e-07, 819200,
                     50e9, 56510),
    "opt-66b-h100": (0.014678078585183043, 7.666116795822707e-05, 5.963842264914055e-10,
                     0.014677610125373134, 7.712962776813607e-05, 2.2127635054253503e-07,
                     2359296, 200e9, 66359),
    "opt-175b-a100-tp8pp2": (0.03164883329641026, 0.00027002407384615386,
                             1.5753846153846154e-09, 0.031648008320000004,
                             0.0002708490502564103, 3.717907692307692e-07, 4718592, 400e9,
                             169861),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(OPT_PINNED))
def test_opt_profiles_are_bit_identical(name):
    for cost in (load_profile(name), shipped_profile(name)):  # the file and the code
        got = (cost.prefill_base, cost.prefill_per_token, cost.prefill_per_token2,
               cost.decode_base, cost.decode_per_seq, cost.decode_per_ctx_token,
               cost.kv_bytes_per_token, cost.swap_bytes_per_s,
               cost.notes["kv_capacity_tokens"])  # fmt: skip
        assert got == OPT_PINNED[name]  # exact: no approx
        assert cost.notes["activation_reserve_bytes_per_gpu"] == 0
        assert max_context_of(cost) == 2048
