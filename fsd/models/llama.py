"""Llama family (Llama 2 / 3.x, Mistral, Qwen2 / 2.5, Qwen3), numerically matching HF's
`LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM` and `Qwen3ForCausalLM`.

RMSNorm, rotary positions (optionally llama3-scaled), SwiGLU MLP, grouped-query
attention, optional attention / MLP biases, explicit head_dim, optional tied LM head;
the variants are flags of ModelArch: `qkv_bias` (Qwen2: q/k/v biases, none on o_proj),
`qk_norm` (Qwen3: RMSNorm over each q and k head before RoPE). A sliding window
(Mistral) needs nothing here: the loader caps the context at the window.
"""

from __future__ import annotations

import torch
from torch import nn

from fsd.layers.activation import SiluAndMul
from fsd.layers.attention import AttentionMetadata, PagedAttention
from fsd.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from fsd.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from fsd.layers.norm import HeadRMSNorm, RMSNorm
from fsd.layers.rotary import RotaryEmbedding
from fsd.models.arch import ModelArch
from fsd.models.base import CausalLM, KVCache, WeightSpec, linear_specs, norm_specs


class LlamaAttention(nn.Module):
    """GQA self-attention with RoPE over the paged KV cache (heads split over ranks)."""

    def __init__(self, arch: ModelArch, rotary: RotaryEmbedding, attn_backend: str) -> None:
        super().__init__()
        d = arch.head_dim
        qkv_bias = arch.attention_bias or arch.qkv_bias
        self.qkv_proj = QKVParallelLinear(
            arch.hidden_size, d, arch.num_heads, arch.num_kv_heads, bias=qkv_bias
        )
        self.o_proj = RowParallelLinear(arch.q_size, arch.hidden_size, bias=arch.attention_bias)
        self.qk_norm = arch.qk_norm
        if arch.qk_norm:  # one weight per head_dim, the same for every head (and rank)
            self.q_norm = HeadRMSNorm(d, arch.norm_eps)
            self.k_norm = HeadRMSNorm(d, arch.norm_eps)
        self.rotary_emb = rotary  # shared by every layer
        self.attn = PagedAttention(
            self.qkv_proj.num_heads,
            self.qkv_proj.num_kv_heads,
            d,
            scale=d**-0.5,
            backend=attn_backend,
        )

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        rope = (positions, self.rotary_emb.cos_sin_cache)  # rotated where K/V is stored
        return self.o_proj(self.attn(q, k, v, kv_cache, meta, rope=rope))


class LlamaMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up in one column-parallel matmul."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        inter = arch.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            arch.hidden_size, [inter, inter], bias=arch.mlp_bias
        )
        self.act = SiluAndMul()
        self.down_proj = RowParallelLinear(inter, arch.hidden_size, bias=arch.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residuals."""

    def __init__(self, arch: ModelArch, rotary: RotaryEmbedding, attn_backend: str) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.norm_eps)
        self.self_attn = LlamaAttention(arch, rotary, attn_backend)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.norm_eps)
        self.mlp = LlamaMLP(arch)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        attn = self.self_attn(positions, self.input_layernorm(hidden), kv_cache, meta)
        normed, hidden = self.post_attention_layernorm.add_norm(attn, hidden)  # one kernel on a GPU
        return hidden + self.mlp(normed)


class LlamaForCausalLM(CausalLM):
    """Llama over the paged KV cache: forward -> hidden [T, hidden]; compute_logits -> [N, vocab]."""

    stacked_params = (
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    )

    def __init__(self, arch: ModelArch, attn_backend: str = "auto") -> None:
        if arch.family != "llama":
            raise ValueError(f"LlamaForCausalLM needs a Llama architecture, got {arch.family!r}")
        super().__init__(arch)
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size)
        rotary = RotaryEmbedding(
            arch.head_dim, arch.max_position, arch.rope_theta, arch.rope_scaling
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(arch, rotary, attn_backend) for _ in range(arch.num_layers)
        )
        self.norm = RMSNorm(arch.hidden_size, arch.norm_eps)
        self.lm_head = ParallelLMHead(arch.vocab_size, arch.hidden_size)
        if arch.tie_word_embeddings:
            self.lm_head.tie(self.embed_tokens)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)  # positions enter each layer's attention (RoPE)

    def decoder_layers(self) -> nn.ModuleList:
        return self.layers

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)

    def weight_specs(self) -> list[WeightSpec]:
        a = self.arch
        h, inter = a.hidden_size, a.intermediate_size
        qkv_bias = a.attention_bias or a.qkv_bias
        specs = [WeightSpec("model.embed_tokens.weight", (a.vocab_size, h), "normal")]
        for i in range(a.num_layers):
            lp = f"model.layers.{i}"
            specs += norm_specs(f"{lp}.input_layernorm", h, bias=False)
            specs += linear_specs(f"{lp}.self_attn.q_proj", a.q_size, h, qkv_bias)
            specs += linear_specs(f"{lp}.self_attn.k_proj", a.kv_size, h, qkv_bias)
            specs += linear_specs(f"{lp}.self_attn.v_proj", a.kv_size, h, qkv_bias)
            specs += linear_specs(f"{lp}.self_attn.o_proj", h, a.q_size, a.attention_bias)
            if a.qk_norm:
                specs += norm_specs(f"{lp}.self_attn.q_norm", a.head_dim, bias=False)
                specs += norm_specs(f"{lp}.self_attn.k_norm", a.head_dim, bias=False)
            specs += norm_specs(f"{lp}.post_attention_layernorm", h, bias=False)
            specs += linear_specs(f"{lp}.mlp.gate_proj", inter, h, a.mlp_bias)
            specs += linear_specs(f"{lp}.mlp.up_proj", inter, h, a.mlp_bias)
            specs += linear_specs(f"{lp}.mlp.down_proj", h, inter, a.mlp_bias)
        specs += norm_specs("model.norm", h, bias=False)
        if not a.tie_word_embeddings:
            specs.append(WeightSpec("lm_head.weight", (a.vocab_size, h), "normal"))
        return specs
