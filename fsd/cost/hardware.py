"""Data-sheet numbers: model shapes and GPUs, for the analytic cost profiles.

A `ModelShape` is what the cost of a model depends on (layers, widths, heads, vocab);
a `GPU` is its peak math, HBM bandwidth, memory and links. `fsd.cost.analytic`
derives a `CostModel` from one of each and a TP x PP layout.

Where the numbers come from:
  * OPT: the published facebook/opt-* config.json files (vocab 50272, ffn = 4 x hidden,
    2048 learned positions, biases, LayerNorm, LM head tied to the token table).
  * Llama 3.1: meta-llama/Llama-3.1-8B and -70B config.json. 8B: 32 layers, hidden 4096,
    32 query / 8 KV heads (GQA) of 128, intermediate 14336; 70B: 80 layers, hidden 8192,
    64 query / 8 KV heads of 128, intermediate 28672. Both: vocab 128256, SwiGLU MLP
    (gate, up, down: 3 matrices), RMSNorm (weight only), no biases, RoPE (no position
    table), untied LM head (tie_word_embeddings false), max_position_embeddings 131072,
    bf16 (torch_dtype). That gives 8.03 B and 70.55 B parameters, Meta's 8B and 70B.
  * GPUs: NVIDIA's data sheets (A100 SXM4, H100 SXM5, H200 SXM; see each entry below).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fsd.errors import ConfigError

GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that set its cost."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    num_kv_heads: int | None = None  # None: = num_heads (no GQA)
    head_dim: int | None = None  # None: hidden_size // num_heads
    gated_mlp: bool = False  # Llama's gate/up/down (3 matrices) vs OPT's fc1/fc2
    bias: bool = True  # OPT has biases on every linear layer
    max_position: int = 2048
    # The defaults are OPT's; Llama flips all three (`_llama3`).
    tied_embeddings: bool = True  # the LM head is the token table (no weights of its own)
    learned_positions: bool = True  # OPT's position table; RoPE models have none
    rms_norm: bool = False  # RMSNorm: a weight per norm; LayerNorm: weight and bias

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (weights, biases, norms)."""
        h, f = self.hidden_size, self.intermediate_size
        q = self.num_heads * self.dim
        kv = self.kv_heads * self.dim
        attn = h * q + 2 * h * kv + q * h
        mlp = (3 if self.gated_mlp else 2) * h * f
        biases = (q + 2 * kv + h + f + h) if self.bias else 0
        norms = (2 if self.rms_norm else 4) * h  # two norms per layer
        return attn + mlp + biases + norms

    @property
    def layer_matmul_params(self) -> int:
        """Weights a token multiplies in one layer (what costs 2 FLOPs per parameter)."""
        h, f = self.hidden_size, self.intermediate_size
        q = self.num_heads * self.dim
        kv = self.kv_heads * self.dim
        return h * q + 2 * h * kv + q * h + (3 if self.gated_mlp else 2) * h * f

    @property
    def embedding_params(self) -> int:
        """Token table plus learned positions (OPT keeps 2 extra position rows)."""
        positions = (self.max_position + 2) * self.hidden_size if self.learned_positions else 0
        return self.vocab_size * self.hidden_size + positions

    @property
    def lm_head_params(self) -> int:
        """The LM head's weights (the token table again when tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        head = 0 if self.tied_embeddings else self.lm_head_params
        return self.num_layers * self.layer_params + self.embedding_params + head

    def activation_bytes_per_token(self, tp: int = 1, dtype_bytes: int = 2) -> int:
        """Transient activations one token of an iteration holds on one GPU at its peak.

        The peak is inside a layer's MLP: the residual stream and its normed copy (h
        each), the up-projections' outputs (gate and up for a gated MLP, fc1 otherwise;
        f/tp each) and the activation's output (f/tp). Attention's q, k, v are smaller.
        """
        h, f = self.hidden_size, self.intermediate_size // tp
        return (2 * h + ((2 if self.gated_mlp else 1) + 1) * f) * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of one token, all layers, whole model (the paper's 4*l*h for fp16)."""
        return 2 * self.num_layers * self.kv_heads * self.dim * dtype_bytes


def shape_from_arch(name: str, arch: Any) -> ModelShape:
    """A ModelShape from an `fsd.models.arch.ModelArch` (read by attribute, no torch import)."""
    return ModelShape(
        name=name,
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_heads=arch.num_heads,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        intermediate_size=arch.intermediate_size,
        vocab_size=arch.vocab_size,
        gated_mlp=arch.family == "llama",
        bias=bool(arch.attention_bias or arch.mlp_bias),
        max_position=arch.max_position,
        tied_embeddings=bool(arch.tie_word_embeddings),
        learned_positions=arch.family == "opt",
        rms_norm=arch.family == "llama",
    )


def _opt(name: str, hidden: int, layers: int, heads: int) -> ModelShape:
    return ModelShape(name, layers, hidden, heads, 4 * hidden, vocab_size=50272)


def _llama3(name: str, hidden: int, layers: int, heads: int, intermediate: int) -> ModelShape:
    # Llama 3.1: 8 KV heads of 128, vocab 128256, SwiGLU, RMSNorm, RoPE, untied head, 128k.
    return ModelShape(
        name,
        layers,
        hidden,
        heads,
        intermediate,
        vocab_size=128256,
        num_kv_heads=8,
        head_dim=128,
        gated_mlp=True,
        bias=False,
        max_position=131072,
        tied_embeddings=False,
        learned_positions=False,
        rms_norm=True,
    )


# OPT shapes from the published configs (vocab 50272, ffn = 4 * hidden, 2048 positions);
# Llama 3.1 from meta-llama's config.json files (see the module docstring).
MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        _opt("opt-1.3b", 2048, 24, 32),
        _opt("opt-2.7b", 2560, 32, 32),
        _opt("opt-6.7b", 4096, 32, 32),
        _opt("opt-13b", 5120, 40, 40),
        _opt("opt-30b", 7168, 48, 56),
        _opt("opt-66b", 9216, 64, 72),
        _opt("opt-175b", 12288, 96, 96),
        _llama3("llama3.1-8b", 4096, 32, 32, 14336),
        _llama3("llama3.1-70b", 8192, 80, 64, 28672),
    )
}


@dataclass(frozen=True)
class GPU:
    """Data-sheet numbers of one accelerator and its links, plus achievable fractions."""

    name: str
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s
    hbm_bytes_per_s: float
    memory_bytes: float
    nvlink_bytes_per_s: float  # per GPU, one direction
    pcie_bytes_per_s: float  # effective host<->device copy rate per GPU, one direction
    internode_bytes_per_s: float  # per node, for pipeline hops between nodes
    collective_latency_s: float  # one small-message NCCL all-reduce inside a node
    p2p_latency_s: float  # one pipeline hop (send/recv of activations)
    internode_latency_s: float
    compute_efficiency: float  # fraction of peak a transformer forward sustains
    memory_efficiency: float = 0.8  # fraction of HBM peak that weight/KV streaming reaches
    comm_efficiency: float = 0.75  # NCCL bus bandwidth / NVLink one-direction peak
    layer_overhead_s: float = 10e-6  # launch gaps and tiny kernels per layer per GPU
    step_overhead_s: float = 0.5e-3  # host work per iteration: inputs, sampling, sync
    gpus_per_node: int = 8


# A100 SXM4 80GB: 312 TFLOP/s fp16 dense, 2.0 TB/s HBM2e, NVLink3 600 GB/s
# (both directions), PCIe 4.0 x16 (32 GB/s raw, ~25 GB/s pinned memcpy).
_A100 = GPU(
    "a100",
    peak_flops=312 * TB,
    hbm_bytes_per_s=2.0 * TB,
    memory_bytes=80 * GB,
    nvlink_bytes_per_s=300 * GB,
    pcie_bytes_per_s=25 * GB,
    internode_bytes_per_s=50 * GB,  # p4d: 4 x 100 Gb/s EFA
    collective_latency_s=15e-6,
    p2p_latency_s=10e-6,
    internode_latency_s=30e-6,
    compute_efficiency=0.6,
)

# H100 SXM5 80GB: 989 TFLOP/s fp16/bf16 dense, 3.35 TB/s HBM3, NVLink4 900 GB/s
# (both directions), PCIe 5.0 x16 (64 GB/s raw, ~50 GB/s pinned memcpy).
_H100 = GPU(
    "h100",
    peak_flops=989 * TB,
    hbm_bytes_per_s=3.35 * TB,
    memory_bytes=80 * GB,
    nvlink_bytes_per_s=450 * GB,
    pcie_bytes_per_s=50 * GB,
    internode_bytes_per_s=400 * GB,  # p5: 32 x 100 Gb/s EFA
    collective_latency_s=10e-6,
    p2p_latency_s=8e-6,
    internode_latency_s=20e-6,
    compute_efficiency=0.5,
)

GPUS: dict[str, GPU] = {
    g.name: g
    for g in (
        _A100,
        # The paper's testbed GPU (p4d.24xlarge): A100 SXM4 40GB, 1.555 TB/s HBM2.
        replace(_A100, name="a100-40gb", hbm_bytes_per_s=1.555 * TB, memory_bytes=40 * GB),
        _H100,
        # H200 SXM 141GB: the H100's Hopper die (989 TFLOP/s bf16 dense, NVLink4 900 GB/s,
        # PCIe 5.0 x16) with 141 GB of HBM3e at 4.8 TB/s; p5e nodes keep p5's 3.2 Tb/s EFA.
        # Same die, so the same achievable fractions as the H100.
        replace(_H100, name="h200", hbm_bytes_per_s=4.8 * TB, memory_bytes=141 * GB),
    )
}


def resolve(model: str | ModelShape, gpu: str | GPU) -> tuple[ModelShape, GPU]:
    """The shape and the GPU, each given itself or by its name in `MODELS` / `GPUS`."""
    return _named(model, MODELS, "model shape"), _named(gpu, GPUS, "GPU")


def _named(value: Any, known: Mapping[str, Any], what: str) -> Any:
    """`value` itself, or the entry of `known` it names (ConfigError listing them)."""
    if not isinstance(value, str):
        return value
    if value not in known:
        raise ConfigError(f"unknown {what} {value!r}; known: {', '.join(known)}")
    return known[value]
