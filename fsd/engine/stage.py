"""One pipeline stage of a model: its layers, built and loaded alone.

A stage is built as a whole model of the family with `num_layers` set to the
stage's share, so only its layers' weights and KV are allocated; checkpoint layer
`start + j` loads into local layer `j`. Every stage also holds the (small) embedding,
final norm and LM head -- the last stage needs the embedding when the head is tied
to it -- but only the first stage embeds and only the last one normalises and
computes logits (`CausalLM.forward_stage`). How many layers each stage takes is
the shared rule `fsd.cost.stages.split_layers`, which the simulator uses too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from fsd.cost.stages import split_layers
from fsd.models.arch import ModelArch
from fsd.models.base import CausalLM
from fsd.models.registry import build_model

_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class StageSpan:
    """Layers [start, end) of the model, run by pipeline stage `index` of `count`."""

    index: int
    count: int
    start: int
    end: int

    @classmethod
    def whole(cls, num_layers: int) -> StageSpan:
        """The only stage of an unpipelined model: every layer."""
        return cls(0, 1, 0, num_layers)

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


def stage_spans(num_layers: int, pp: int) -> list[StageSpan]:
    """The `pp` stages' spans, contiguous, sized by `fsd.cost.stages.split_layers`."""
    spans, start = [], 0
    for i, n in enumerate(split_layers(num_layers, pp)):
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
