"""Cost models from first principles, for the simulator (pure Python, no torch).

`fsd profile` measures the engine it runs on; the simulator also wants the paper's
testbeds (OPT-13B/66B/175B on A100s, and the same on H100s) and today's deployments
(Llama-3.1-8B on one H100 or H200, 70B at TP 4 / TP 8), which nobody here can
measure. This module derives a `CostModel` for any model shape on any GPU and any
TP x PP layout from the hardware's data-sheet numbers and a few efficiency factors.
The derivation is written out in `fsd/cost/profiles/README.md`; in short:

  decode(b, C) = [weight bytes / (HBM * e_mem)]           read every weight once
               + b * [2 * params / (peak * e_flop)]         the GEMM work per sequence
               + C * [KV bytes per token / (HBM * e_mem)]   read each cached token
               + TP all-reduces, PP hops, launch gaps       (latency terms)
  prefill(n)   = weight read + n * [2 * params / (peak * e_flop)] + n^2 * [causal attention]
  chunk(n, c)  = prefill(n) + c * [KV read, as decode] + n * c * [attention, every pair]

Every quantity is per GPU: with TP degree t a GPU holds 1/t of each layer, and a token
passes the pp pipeline stages one after another, so an iteration's latency is the sum
over stages of 1/(t*pp) of the model = 1/t of it; each stage is busy for 1/pp of that
(`CostModel.pipeline_stages`, which the simulator pipelines micro-batches on). Memory
is per stage (`plan_stages`): a stage's GPUs hold its layers' weights and its layers'
KV with heads/t each, so the KV capacity is that of the tightest stage. Terms are added rather than
max()-ed: at serving batch sizes the weight-streaming GEMVs and the math do not
overlap perfectly, and measured decode steps grow steadily with batch
(the max() roofline is kept in the notes as a lower bound).

Shapes and GPUs are `fsd.cost.hardware`'s (its docstring names each number's source):
KV bytes count the KV heads (GQA), attention math the query heads, GEMM work every
matrix (SwiGLU: 3), and an untied LM head is stored besides the token table. KV room
per GPU = memory x utilization - weights - activations (`ACTIVATION_TOKENS`, Llama only).

Run `python -m fsd.cost.analytic [DIR]` to regenerate the shipped JSON profiles.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from fsd.cost.hardware import GB, GPU, ModelShape, resolve
from fsd.cost.model import CostModel
from fsd.cost.stages import split_layers
from fsd.errors import ConfigError

# The shipped profiles: (model, gpu, tp, pp). The paper runs 66B on 4 GPUs and 175B on
# 16 (TP 8 x PP 2 over two p4d nodes of A100-40GB). 8 x 80 GB already hold 175B's 350 GB
# of weights, so 8-way TP is the single-node default; the two TP 8 x PP 2 profiles are
# the paper's shape of deployment on 80 GB GPUs and on its own 40 GB testbed.
SHIPPED: dict[str, tuple[str, str, int, int]] = {
    "opt-13b-a100": ("opt-13b", "a100", 1, 1),
    "opt-13b-h100": ("opt-13b", "h100", 1, 1),
    "opt-66b-a100": ("opt-66b", "a100", 4, 1),
    "opt-66b-h100": ("opt-66b", "h100", 4, 1),
    "opt-175b-a100": ("opt-175b", "a100", 8, 1),
    "opt-175b-h100": ("opt-175b", "h100", 8, 1),
    "opt-175b-a100-tp8pp2": ("opt-175b", "a100", 8, 2),
    "opt-175b-a100-40gb-tp8pp2": ("opt-175b", "a100-40gb", 8, 2),
    # Llama 3.1 (bf16, 128k context): 8B fits one GPU; 70B's 141 GB needs TP 4 or 8.
    "llama3.1-8b-h100": ("llama3.1-8b", "h100", 1, 1),
    "llama3.1-8b-h200": ("llama3.1-8b", "h200", 1, 1),
    "llama3.1-70b-h100-tp4": ("llama3.1-70b", "h100", 4, 1),
    "llama3.1-70b-h100-tp8": ("llama3.1-70b", "h100", 8, 1),
    "llama3.1-70b-h200-tp4": ("llama3.1-70b", "h200", 4, 1),
    "llama3.1-70b-h200-tp8": ("llama3.1-70b", "h200", 8, 1),
}

GPU_MEMORY_UTILIZATION = 0.9  # what the engine gives to weights + KV by default
# Activations kept room for: the largest iteration's (SchedConfig.max_batch_tokens'
# default). The OPT profiles predate it and keep none: their numbers stay as published.
ACTIVATION_TOKENS = 4096
RESERVES_ACTIVATIONS = frozenset(name for name in SHIPPED if name.startswith("llama"))


def _check_layout(shape: ModelShape, gpu: GPU, tp: int, pp: int) -> None:
    if tp < 1 or pp < 1:
        raise ConfigError(f"tp and pp must be >= 1, got tp={tp} pp={pp}")
    if tp > gpu.gpus_per_node:
        raise ConfigError(
            f"tp={tp} spans nodes of {gpu.gpus_per_node} GPUs; tensor parallelism across "
            "nodes is not modelled (use pipeline stages for more GPUs)"
        )
    if shape.num_heads % tp or shape.intermediate_size % tp:
        raise ConfigError(f"{shape.name}: {shape.num_heads} heads do not split {tp} ways")
    if shape.kv_heads % tp:  # (replicating KV heads is not modelled)
        raise ConfigError(f"{shape.name}: {shape.kv_heads} KV heads do not split {tp} ways")
    if pp > shape.num_layers:
        raise ConfigError(f"{shape.name}: pp={pp} exceeds its {shape.num_layers} layers")


def _internode_hops(tp: int, pp: int, gpus_per_node: int) -> int:
    """Stage boundaries that cross a node when stages fill nodes in order."""
    return sum(
        1 for s in range(1, pp) if (s * tp) // gpus_per_node != ((s - 1) * tp) // gpus_per_node
    )


@dataclass(frozen=True)
class Stage:
    """One pipeline stage's share of the model, seen from one GPU of its TP group."""

    index: int
    layers: int
    weights_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float  # its layers' K and V, heads/tp of them
    kv_capacity_tokens: int  # tokens whose KV fits beside the weights


def plan_stages(
    model: str | ModelShape,
    gpu: str | GPU,
    tp: int = 1,
    pp: int = 1,
    dtype_bytes: int = 2,
    activation_tokens: int = 0,
) -> list[Stage]:
    """The memory of each stage: weights and KV per GPU, and the KV room left.

    The first stage also holds the token and position tables; the last stage holds the
    LM head: a tied one is the token table, so with pp > 1 that table is stored twice.
    Every stage keeps room for `activation_tokens` tokens' activations.
    """
    shape, g = resolve(model, gpu)
    _check_layout(shape, g, tp, pp)
    budget = g.memory_bytes * GPU_MEMORY_UTILIZATION
    reserve = activation_tokens * shape.activation_bytes_per_token(tp, dtype_bytes)
    stages = []
    for s, layers in enumerate(split_layers(shape.num_layers, pp)):
        params = layers * shape.layer_params
        if s == 0:
            params += shape.embedding_params
        if s == pp - 1 and (s > 0 or not shape.tied_embeddings):
            params += shape.lm_head_params
        weights = params * dtype_bytes / tp
        kv_all_heads = 2 * layers * shape.kv_heads * shape.dim * dtype_bytes
        # every GPU of the stage holds heads/tp of each of its layers' K and V
        capacity = max(0, int((budget - weights - reserve) * tp / kv_all_heads))
        stages.append(Stage(s, layers, weights, kv_all_heads / tp, capacity))
    return stages


@dataclass(frozen=True)
class Terms:
    """The derived per-iteration terms (seconds), before they become a CostModel."""

    weight_read: float  # stream this GPU's share of every weight once, summed over stages
    lm_head_flops: float  # the LM head's math for one sequence's last token
    fixed_overhead: float  # launches, collective and hop latencies, host step
    per_seq_flops: float  # the layers' GEMM work for one token
    per_seq_comm: float  # all-reduce and hop bytes for one token
    per_ctx_token: float  # read one cached token's K and V (+ its attention math)
    per_token2: float  # causal attention math in prefill, per n^2
    kv_write_per_token: float  # writing one new token's K and V

    @property
    def decode_base(self) -> float:
        return self.weight_read + self.fixed_overhead

    @property
    def decode_per_seq(self) -> float:
        return self.per_seq_flops + self.per_seq_comm + self.lm_head_flops + self.kv_write_per_token

    @property
    def prefill_base(self) -> float:
        return self.weight_read + self.fixed_overhead + self.lm_head_flops

    @property
    def prefill_per_token(self) -> float:
        return self.per_seq_flops + self.per_seq_comm + self.kv_write_per_token

    @property
    def prefill_per_ctx_token(self) -> float:
        """A prefill chunk's attention math per (new token, cached token) pair: all of
        its q.k and p.v, where causal prefill does half of its n x n (so 2 x per_token2).
        Reading the cached KV is per cached token, as in decode (per_ctx_token)."""
        return 2 * self.per_token2


def derive_terms(
    model: str | ModelShape, gpu: str | GPU, tp: int = 1, pp: int = 1, dtype_bytes: int = 2
) -> Terms:
    """Every term of the iteration time of `model` on tp x pp GPUs of kind `gpu`."""
    shape, g = resolve(model, gpu)
    _check_layout(shape, g, tp, pp)
    L, h = shape.num_layers, shape.hidden_size
    flops_rate = g.peak_flops * g.compute_efficiency
    hbm = g.hbm_bytes_per_s * g.memory_efficiency
    # A token's pass: each stage's GPU holds 1/(tp*pp) of the layers' weights and the
    # pp stages run one after another, so the pass reads 1/tp of them per GPU.
    weights_read = (L * shape.layer_params + shape.vocab_size * h) * dtype_bytes / tp
    weight_read = weights_read / hbm
    lm_head_flops = 2 * shape.vocab_size * h / tp / flops_rate
    per_seq_flops = 2 * L * shape.layer_matmul_params / tp / flops_rate
    # Megatron TP: two all-reduces of the hidden state per layer (attention out, MLP out).
    allreduces = 2 * L if tp > 1 else 0
    ring_bytes = 2 * (tp - 1) / tp * h * dtype_bytes  # per token, per all-reduce
    nvlink = g.nvlink_bytes_per_s * g.comm_efficiency
    hops_inter = _internode_hops(tp, pp, g.gpus_per_node)
    hops_intra = pp - 1 - hops_inter
    per_seq_comm = allreduces * ring_bytes / nvlink
    per_seq_comm += hops_intra * h * dtype_bytes / nvlink
    per_seq_comm += hops_inter * h * dtype_bytes / (g.internode_bytes_per_s * g.comm_efficiency)
    fixed = (
        L * g.layer_overhead_s  # every layer runs once per pass, stage after stage
        + allreduces * g.collective_latency_s
        + hops_intra * g.p2p_latency_s
        + hops_inter * g.internode_latency_s
        + g.step_overhead_s
    )
    kv_token = shape.kv_bytes_per_token(dtype_bytes) / tp
    attn_flops_per_ctx = 4 * L * shape.num_heads * shape.dim / tp  # q.k and p.v per cached token
    per_ctx = kv_token / hbm + attn_flops_per_ctx / flops_rate
    # Prefill attention: causal, so half of the n x n scores: 2 * L * (heads*dim) * n^2 FLOPs.
    per_token2 = 2 * L * shape.num_heads * shape.dim / tp / flops_rate
    kv_write = kv_token / hbm
    return Terms(
        weight_read=weight_read,
        lm_head_flops=lm_head_flops,
        fixed_overhead=fixed,
        per_seq_flops=per_seq_flops,
        per_seq_comm=per_seq_comm,
        per_ctx_token=per_ctx,
        per_token2=per_token2,
        kv_write_per_token=kv_write,
    )


def roofline_decode_time(
    model: str | ModelShape,
    gpu: str | GPU,
    batch_size: int,
    context_tokens: int,
    tp: int = 1,
    pp: int = 1,
    dtype_bytes: int = 2,
) -> float:
    """The ideal max(bytes / bandwidth, FLOPs / peak) decode step at 100% of peak (a floor)."""
    shape, g = resolve(model, gpu)
    _check_layout(shape, g, tp, pp)
    L, h = shape.num_layers, shape.hidden_size
    nbytes = (L * shape.layer_params + shape.vocab_size * h) * dtype_bytes / tp
    nbytes += context_tokens * shape.kv_bytes_per_token(dtype_bytes) / tp
    flops = batch_size * 2 * (L * shape.layer_matmul_params + shape.vocab_size * h) / tp
    flops += context_tokens * 4 * L * shape.num_heads * shape.dim / tp
    return max(nbytes / g.hbm_bytes_per_s, flops / g.peak_flops)


def analytic_profile(
    model: str | ModelShape,
    gpu: str | GPU,
    tp: int = 1,
    pp: int = 1,
    dtype_bytes: int = 2,
    name: str | None = None,
    activation_tokens: int = 0,
) -> CostModel:
    """The CostModel of `model` on tp x pp GPUs of kind `gpu` (any layout, e.g. 175B on 8x2).

    Times are the latency of one iteration through all pp stages (`pipeline_stages` =
    pp: each stage is busy for 1/pp of it). kv_bytes_per_token is the whole model's KV
    per token; swap_bytes_per_s is the host links of all tp*pp GPUs together, since each
    GPU moves its own shard over its own PCIe link at once (all stages in parallel).
    The KV capacity is the tightest stage's (`plan_stages`), after `activation_tokens`
    tokens' activations.
    """
    shape, g = resolve(model, gpu)
    t = derive_terms(shape, g, tp, pp, dtype_bytes)
    stages = plan_stages(shape, g, tp, pp, dtype_bytes, activation_tokens)
    n_gpu = tp * pp
    weights_per_gpu = shape.num_params * dtype_bytes / n_gpu
    reserve = activation_tokens * shape.activation_bytes_per_token(tp, dtype_bytes)
    budget = g.memory_bytes * GPU_MEMORY_UTILIZATION
    heaviest = max(s.weights_bytes_per_gpu for s in stages)
    if heaviest + reserve >= budget:
        raise ConfigError(
            f"{shape.name} needs {heaviest / GB:.1f} GB of weights per GPU on "
            f"tp={tp} x pp={pp}; a {g.name} offers {budget / GB:.1f} GB: use more GPUs"
        )
    kv_total = shape.kv_bytes_per_token(dtype_bytes)
    kv_capacity = min(s.kv_capacity_tokens for s in stages)
    layout = f"tp{tp}" + (f"xpp{pp}" if pp > 1 else "")
    cost = CostModel(
        name=name or f"{shape.name}-{g.name}-{layout}",
        prefill_base=t.prefill_base,
        prefill_per_token=t.prefill_per_token,
        prefill_per_token2=t.per_token2,
        prefill_per_ctx_token=t.prefill_per_ctx_token,
        decode_base=t.decode_base,
        decode_per_seq=t.decode_per_seq,
        decode_per_ctx_token=t.per_ctx_token,
        kv_bytes_per_token=kv_total,
        swap_bytes_per_s=g.pcie_bytes_per_s * n_gpu,
        pipeline_stages=pp,
    )
    layout_notes = {"tp": tp, "pp": pp, "num_gpus": n_gpu, "dtype_bytes": dtype_bytes}
    sizes = {
        "terms_s": dataclasses.asdict(t),
        "weights_bytes_per_gpu": weights_per_gpu,
        "activation_reserve_bytes_per_gpu": reserve,
        "kv_capacity_tokens": kv_capacity,
    }
    notes = _notes(cost, shape, g, layout_notes, sizes, stages)
    return dataclasses.replace(cost, notes=notes)


def _notes(
    cost: CostModel,
    shape: ModelShape,
    g: GPU,
    layout: dict[str, int],
    sizes: dict[str, object],
    stages: list[Stage],
) -> dict[str, object]:
    """A profile's record of where its numbers come from, and what they give."""
    tp, pp, dtype_bytes = layout["tp"], layout["pp"], layout["dtype_bytes"]
    notes: dict[str, object] = {
        "source": "analytic (fsd.cost.analytic); derivation in fsd/cost/profiles/README.md",
        "model": dataclasses.asdict(shape) | {"num_params": shape.num_params},
        "gpu": dataclasses.asdict(g),
        "layout": layout,
        "gpus": f"{tp * pp} x {g.name} (tp={tp}, pp={pp})",
        **sizes,
        "pipeline": "iteration times are the latency through all stages; "
        "each stage is busy for about 1/pp of it",
        "reference_points_s": _reference_points(cost),
        "roofline_floor_s": {
            "decode_b1_ctx1": roofline_decode_time(shape, g, 1, 1, tp, pp, dtype_bytes),
            "decode_b16_ctx1k": roofline_decode_time(shape, g, 16, 16 * 1024, tp, pp, dtype_bytes),
        },
    }
    if pp > 1:
        notes["stages"] = [dataclasses.asdict(s) for s in stages]
        notes["stage_time_s"] = {
            k: v / pp for k, v in _reference_points(cost).items() if not k.startswith("swap")
        }
    return notes


def _reference_points(cost: CostModel) -> dict[str, float]:
    """The numbers the README tabulates."""
    return {
        "q1_min_iteration": cost.min_iteration_time,
        "prefill_512": cost.prefill_time(512),
        "prefill_2048": cost.prefill_time(2048),
        "prefill_2048_chunk256": cost.chunked_prefill_time(2048, 256),
        "prefill_2048_chunk512": cost.chunked_prefill_time(2048, 512),
        "decode_b1_ctx1k": cost.decode_time(1, 1024),
        "decode_b16_ctx1k_each": cost.decode_time(16, 16 * 1024),
        "swap_513_tokens": cost.swap_time(513),
    }


def shipped_profile(name: str) -> CostModel:
    """Build one of the shipped profiles (the JSON files are these, saved)."""
    if name not in SHIPPED:
        raise ConfigError(f"unknown shipped profile {name!r}; shipped: {', '.join(SHIPPED)}")
    model, gpu, tp, pp = SHIPPED[name]
    tokens = ACTIVATION_TOKENS if name in RESERVES_ACTIVATIONS else 0
    return analytic_profile(model, gpu, tp=tp, pp=pp, name=name, activation_tokens=tokens)


def write_shipped_profiles(directory: str | Path) -> list[Path]:
    """Write every shipped profile as `<name>.json` into `directory`."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in SHIPPED:
        path = out / f"{name}.json"
        shipped_profile(name).save(path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """`python -m fsd.cost.analytic [DIR]`: regenerate the shipped profiles and print them."""
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else Path(__file__).parent / "profiles"
    for path in write_shipped_profiles(directory):
        pts = CostModel.load(path).notes["reference_points_s"]
        assert isinstance(pts, dict)
        cells = "  ".join(f"{k}={v * 1e3:.2f}ms" for k, v in pts.items())
        print(f"{path.name}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
