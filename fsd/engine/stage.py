"""One pipeline stage of a model: its layers, built and loaded alone.

A stage is built as a whole model of the family with `num_layers` set to the
stage's share, so only its layers' weights and KV are allocated; checkpoint layer
`start + j` loads into local layer `j`. Every stage also holds the (small) embedding,
final norm and LM head -- the last stage needs the embedding when the head is tied
to it -- but only the first stage embeds and only the last one normalises and
computes logits.

The family adapters below name the parts of OPT and Llama that a stage runs; the
models' own `forward` is used unchanged when there is a single stage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from fsd.errors import ConfigError
from fsd.layers.attention import AttentionMetadata
from fsd.models.arch import ModelArch
from fsd.models.base import CausalLM
from fsd.models.registry import build_model

KVCache = tuple[torch.Tensor, torch.Tensor]
_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class StageSpan:
    """Layers [start, end) of the model, run by pipeline stage `index` of `count`."""

    index: int
    count: int
    start: int
    end: int

    @property
    def num_layers(self) -> int:
        return self.end - self.start

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def holds(self, name: str) -> bool:
        """Whether checkpoint tensor `name` belongs here (every non-layer tensor does)."""
        m = _LAYER.search(name)
        return m is None or self.start <= int(m.group(1)) < self.end


def split_layers(num_layers: int, pp: int) -> list[StageSpan]:
    """Even contiguous shares; the first `num_layers % pp` stages take one layer more."""
    if not 1 <= pp <= num_layers:
        raise ConfigError(f"pp={pp} must be between 1 and the model's num_layers ({num_layers})")
    base, extra = divmod(num_layers, pp)
    spans, start = [], 0
    for i in range(pp):
        n = base + (1 if i < extra else 0)
        spans.append(StageSpan(i, pp, start, start + n))
        start += n
    return spans


def stage_weights(
    weights: Iterable[tuple[str, torch.Tensor]], span: StageSpan
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint tensors a stage loads, its layers renumbered from 0."""
    for name, tensor in weights:
        m = _LAYER.search(name)
        if m is None:
            yield name, tensor
        elif span.holds(name):
            local = f".layers.{int(m.group(1)) - span.start}."
            yield name[: m.start()] + local + name[m.end() :], tensor


def build_stage(arch: ModelArch, span: StageSpan, attn_backend: str) -> CausalLM:
    """The family's model with only this stage's layers (under the caller's device/dtype)."""
    return build_model(arch.replace(num_layers=span.num_layers), attn_backend)


class StageModel:
    """Runs one stage: embed (first), its layers, final norm + logits (last)."""

    def __init__(self, model: CausalLM, span: StageSpan) -> None:
        self.model = model
        self.span = span
        family = model.arch.family
        if family not in _ADAPTERS:
            raise ConfigError(f"pipeline parallelism does not support the {family!r} family")
        self._parts = _ADAPTERS[family]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor | None,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """This stage's output: hidden states [T, hidden] (normalised on the last stage)."""
        if self.span.first and self.span.last:
            return self.model(input_ids, positions, kv_caches, meta)
        parts = self._parts
        if self.span.first:
            hidden = parts.embed(self.model, input_ids, positions)
        assert hidden is not None, "a later stage needs the previous stage's activations"
        for layer, kv in zip(parts.layers(self.model), kv_caches, strict=True):
            hidden = parts.run_layer(layer, positions, hidden, kv, meta)
        return parts.final(self.model, hidden) if self.span.last else hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)


class _OPTParts:
    @staticmethod
    def embed(m, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        d = m.decoder
        embeds = d.embed_tokens(ids)
        if d.project_in is not None:
            embeds = d.project_in(embeds)
        return embeds + d.embed_positions(pos)

    @staticmethod
    def layers(m) -> Iterable[torch.nn.Module]:  # noqa: ANN001
        return m.decoder.layers

    @staticmethod
    def run_layer(layer, pos, hidden, kv, meta) -> torch.Tensor:  # noqa: ANN001
        return layer(hidden, kv, meta)

    @staticmethod
    def final(m, hidden: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        norm = m.decoder.final_layer_norm
        return norm(hidden) if norm is not None else hidden


class _LlamaParts:
    @staticmethod
    def embed(m, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return m.embed_tokens(ids)

    @staticmethod
    def layers(m) -> Iterable[torch.nn.Module]:  # noqa: ANN001
        return m.layers

    @staticmethod
    def run_layer(layer, pos, hidden, kv, meta) -> torch.Tensor:  # noqa: ANN001
        return layer(pos, hidden, kv, meta)

    @staticmethod
    def final(m, hidden: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return m.norm(hidden)


_ADAPTERS = {"opt": _OPTParts, "llama": _LlamaParts}
