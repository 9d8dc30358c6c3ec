"""Meta's OPT (facebook/opt-*), numerically matching HF `OPTForCausalLM`.

Learned positions (offset 2), LayerNorm before (most sizes) or after (opt-350m)
each block, ReLU FFN, biases everywhere, optional project_in / project_out when the
word embedding is narrower than the model, LM head tied to the embedding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fsd.layers.activation import get_act_fn
from fsd.layers.attention import AttentionMetadata, PagedAttention
from fsd.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from fsd.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    default_weight_loader,
    set_weight_attrs,
)
from fsd.layers.norm import LayerNorm
from fsd.models.arch import ModelArch
from fsd.models.base import CausalLM, KVCache, WeightSpec, linear_specs, norm_specs

POSITION_OFFSET = 2  # OPT's position table has two leading rows (a fairseq padding relic)


class OPTLearnedPositions(nn.Module):
    """Position table [max_position + 2, hidden], replicated on every rank."""

    def __init__(self, max_position: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(max_position + POSITION_OFFSET, hidden_size), requires_grad=False
        )
        set_weight_attrs(self.weight, default_weight_loader)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return F.embedding(positions + POSITION_OFFSET, self.weight)


class OPTAttention(nn.Module):
    """Multi-head self-attention over the paged KV cache (heads split over ranks)."""

    def __init__(self, arch: ModelArch, attn_backend: str) -> None:
        super().__init__()
        h, d = arch.hidden_size, arch.head_dim
        self.qkv_proj = QKVParallelLinear(
            h, d, arch.num_heads, arch.num_kv_heads, bias=arch.attention_bias
        )
        self.out_proj = RowParallelLinear(h, h, bias=arch.attention_bias)
        # HF scales q before the dot product (not the scores); doing the same keeps fp32 exact.
        self.scaling = d**-0.5
        self.attn = PagedAttention(
            self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, d, scale=1.0, backend=attn_backend
        )

    def forward(
        self, hidden: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        q = q * self.scaling
        out = self.attn(q, k, v, kv_cache, meta)
        return self.out_proj(out)


class OPTDecoderLayer(nn.Module):
    """Attention + ReLU FFN with residuals; LayerNorm before or after per the config."""

    def __init__(self, arch: ModelArch, attn_backend: str) -> None:
        super().__init__()
        h, affine = arch.hidden_size, arch.norm_elementwise_affine
        self.pre_norm = arch.do_layer_norm_before
        self.self_attn = OPTAttention(arch, attn_backend)
        self.self_attn_layer_norm = LayerNorm(h, arch.norm_eps, affine)
        self.fc1 = ColumnParallelLinear(h, arch.intermediate_size, bias=arch.mlp_bias)
        self.act = get_act_fn(arch.hidden_act)
        self.fc2 = RowParallelLinear(arch.intermediate_size, h, bias=arch.mlp_bias)
        self.final_layer_norm = LayerNorm(h, arch.norm_eps, affine)

    def forward(
        self,
        positions: torch.Tensor,  # unused: OPT adds learned positions once, in `embed`
        hidden: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        residual = hidden
        if self.pre_norm:
            hidden = self.self_attn_layer_norm(hidden)
        hidden = residual + self.self_attn(hidden, kv_cache, meta)
        if not self.pre_norm:
            hidden = self.self_attn_layer_norm(hidden)

        residual = hidden
        if self.pre_norm:
            hidden = self.final_layer_norm(hidden)
        hidden = residual + self.fc2(self.act(self.fc1(hidden)))
        if not self.pre_norm:
            hidden = self.final_layer_norm(hidden)
        return hidden


class OPTDecoder(nn.Module):
    """Embeddings, the decoder stack and the final LayerNorm (named as in HF).

    A container only: OPTForCausalLM's stage hooks run its parts.
    """

    def __init__(self, arch: ModelArch, attn_backend: str) -> None:
        super().__init__()
        h = arch.hidden_size
        proj = arch.word_embed_proj_dim or h
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, proj)
        self.embed_positions = OPTLearnedPositions(arch.max_position, h)
        self.project_in = ReplicatedLinear(proj, h, bias=False) if proj != h else None
        self.project_out = ReplicatedLinear(h, proj, bias=False) if proj != h else None
        self.layers = nn.ModuleList(
            OPTDecoderLayer(arch, attn_backend) for _ in range(arch.num_layers)
        )
        self.final_layer_norm = (
            LayerNorm(h, arch.norm_eps, arch.norm_elementwise_affine)
            if arch.final_layer_norm
            else None
        )


class OPTForCausalLM(CausalLM):
    """OPT over the paged KV cache: forward -> hidden [T, hidden]; compute_logits -> [N, vocab]."""

    stacked_params = (
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
    )

    def __init__(self, arch: ModelArch, attn_backend: str = "auto") -> None:
        if arch.family != "opt":
            raise ValueError(f"OPTForCausalLM needs an OPT architecture, got {arch.family!r}")
        super().__init__(arch)
        self.decoder = OPTDecoder(arch, attn_backend)
        self.lm_head = ParallelLMHead(arch.vocab_size, arch.word_embed_proj_dim or arch.hidden_size)
        if arch.tie_word_embeddings:
            self.lm_head.tie(self.decoder.embed_tokens)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        d = self.decoder
        embeds = d.embed_tokens(input_ids)
        if d.project_in is not None:
            embeds = d.project_in(embeds)
        return embeds + d.embed_positions(positions)

    def decoder_layers(self) -> nn.ModuleList:
        return self.decoder.layers

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        norm = self.decoder.final_layer_norm
        return norm(hidden) if norm is not None else hidden

    def logits_input(self, hidden: torch.Tensor) -> torch.Tensor:
        # project_out runs here, on the few rows that need logits, not on every token.
        return self.decoder.project_out(hidden) if self.decoder.project_out is not None else hidden

    def weight_specs(self) -> list[WeightSpec]:
        a = self.arch
        h, proj = a.hidden_size, a.word_embed_proj_dim or a.hidden_size
        affine = a.norm_elementwise_affine
        p = "model.decoder"
        specs = [
            WeightSpec(f"{p}.embed_tokens.weight", (a.vocab_size, proj), "normal"),
            WeightSpec(
                f"{p}.embed_positions.weight", (a.max_position + POSITION_OFFSET, h), "normal"
            ),
        ]
        if proj != h:
            specs += linear_specs(f"{p}.project_in", h, proj, bias=False)
            specs += linear_specs(f"{p}.project_out", proj, h, bias=False)
        for i in range(a.num_layers):
            lp = f"{p}.layers.{i}"
            for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
                specs += linear_specs(f"{lp}.self_attn.{name}", h, h, a.attention_bias)
            if affine:
                specs += norm_specs(f"{lp}.self_attn_layer_norm", h, bias=True)
            specs += linear_specs(f"{lp}.fc1", a.intermediate_size, h, a.mlp_bias)
            specs += linear_specs(f"{lp}.fc2", h, a.intermediate_size, a.mlp_bias)
            if affine:
                specs += norm_specs(f"{lp}.final_layer_norm", h, bias=True)
        if a.final_layer_norm and affine:
            specs += norm_specs(f"{p}.final_layer_norm", h, bias=True)
        if not a.tie_word_embeddings:
            specs.append(WeightSpec("lm_head.weight", (a.vocab_size, proj), "normal"))
        return specs
