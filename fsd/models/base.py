"""What every model family shares: the forward pass over pipeline-stage hooks,
loading HF-named weights and seeded random init.

A family provides three hooks -- `embed` (token ids -> the first layer's input),
`decoder_layers` (the layers it holds, each called as `layer(positions, hidden,
kv_cache, meta)`) and `final_norm` -- and the base class runs them: `forward` for
the whole model, `forward_stage` for one pipeline stage (embed only on the first,
final norm only on the last). A stage is the family's model built with only its
share of the layers (fsd.engine.stage), so no engine code reaches into a family.

A family module names its parameters after the HuggingFace checkpoint (without the
leading `model.`), except where it merges several checkpoint tensors into one
parameter: `stacked_params` lists those as (merged, checkpoint part, shard id), e.g.
("qkv_proj", "q_proj", "q"). Each parameter's `weight_loader` slices the full
checkpoint tensor for this tensor-parallel rank (see fsd.layers.linear).

`init_random` generates the full, unsharded checkpoint tensors and feeds them
through the same loaders, so a preset holds the same weights at any tensor-parallel
size, on any device. Each tensor's generator is seeded from (seed, name), so the
weights do not depend on the order of generation either.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from fsd.errors import ModelLoadError
from fsd.layers.attention import AttentionMetadata
from fsd.layers.linear import ShardId
from fsd.models.arch import ModelArch

KVCache = tuple[torch.Tensor, torch.Tensor]

INIT_STD = 0.02


@dataclass(frozen=True)
class WeightSpec:
    """One full checkpoint tensor: its HF name, shape and how a random init fills it."""

    name: str
    shape: tuple[int, ...]
    init: str  # "normal" (std 0.02) | "zeros" | "ones"


class CausalLM(nn.Module, abc.ABC):
    """Base of the model families: forward over the stage hooks, HF weights, logits."""

    stacked_params: ClassVar[tuple[tuple[str, str, ShardId], ...]] = ()
    # Checkpoint tensors that carry nothing we need (derived buffers of old exports).
    ignored_suffixes: ClassVar[tuple[str, ...]] = ("rotary_emb.inv_freq",)

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.arch = arch

    # -- to be provided by each family -------------------------------------------------

    @abc.abstractmethod
    def weight_specs(self) -> list[WeightSpec]:
        """Every tensor of a full HF checkpoint of this architecture."""

    @abc.abstractmethod
    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first layer's input [T, hidden]: token (and learned position) embeddings."""

    @abc.abstractmethod
    def decoder_layers(self) -> nn.ModuleList:
        """The decoder layers this model holds, in order (a stage holds its share)."""

    @abc.abstractmethod
    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The last layer's output as the LM head takes it (the final norm, if any)."""

    def logits_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states as the LM head takes them (OPT projects them out first)."""
        return hidden

    # -- shared ------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """The whole model over the paged KV cache: hidden states [T, hidden]."""
        return self.forward_stage(input_ids, positions, None, kv_caches, meta)

    def forward_stage(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden: torch.Tensor | None,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        first: bool = True,
        last: bool = True,
    ) -> torch.Tensor:
        """The layers this model holds, run as one pipeline stage.

        `first`: embed `input_ids` (else continue from the previous stage's `hidden`);
        `last`: apply the final norm. `kv_caches` holds one (K, V) per layer held.
        """
        if first:
            hidden = self.embed(input_ids, positions)
        if hidden is None:
            raise ValueError("a later pipeline stage needs the previous stage's activations")
        for layer, kv_cache in zip(self.decoder_layers(), kv_caches, strict=True):
            hidden = layer(positions, hidden, kv_cache, meta)
        return self.final_norm(hidden) if last else hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] final hidden states -> [N, vocab] float32 logits."""
        return self.lm_head(self.logits_input(hidden)).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the parameters; every parameter must be covered.

        Raises ModelLoadError naming an unexpected, misshapen, duplicated or missing weight.
        """
        params = dict(self.named_parameters())
        expected = {(n, sid) for n, p in params.items() for sid in getattr(p, "shard_ids", (None,))}
        loaded: set[tuple[str, ShardId]] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if name.endswith(self.ignored_suffixes):
                continue
            if name == "lm_head.weight" and self.arch.tie_word_embeddings:
                continue  # some exports store the tied head too; the embedding wins
            target, shard_id = self._merged_name(name)
            param = params.get(target)
            if param is None:
                raise ModelLoadError(
                    f"unexpected weight {hf_name!r}: the {self.arch.family} model has no such parameter"
                )
            if (target, shard_id) in loaded:
                raise ModelLoadError(f"weight {hf_name!r} appears twice in the checkpoint")
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                raise ModelLoadError(f"parameter {target!r} has no weight loader")
            try:
                loader(param, tensor, shard_id)
            except (ValueError, RuntimeError) as exc:
                raise ModelLoadError(f"weight {hf_name!r} does not fit: {exc}") from None
            loaded.add((target, shard_id))
        missing = sorted(expected - loaded, key=str)
        if missing:
            names = [self._hf_name(n, sid) for n, sid in missing]
            more = f" (and {len(names) - 8} more)" if len(names) > 8 else ""
            raise ModelLoadError(f"checkpoint is missing weights: {', '.join(names[:8])}{more}")

    def init_random(self, seed: int) -> None:
        """Seeded random weights: normal(0, 0.02) weights, zero biases, unit norms."""
        self.load_weights(random_weights(self.weight_specs(), seed))

    def _merged_name(self, name: str) -> tuple[str, ShardId]:
        for merged, part, shard_id in self.stacked_params:
            if f".{part}." in name:
                return name.replace(f".{part}.", f".{merged}."), shard_id
        return name, None

    def _hf_name(self, name: str, shard_id: ShardId) -> str:
        for merged, part, sid in self.stacked_params:
            if sid == shard_id and f".{merged}." in name:
                name = name.replace(f".{merged}.", f".{part}.")
                break
        return name if name.startswith("lm_head.") else f"model.{name}"


def tensor_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed from (seed, tensor name), stable across runs and machines."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def random_weights(specs: Iterable[WeightSpec], seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Full float32 CPU tensors for `specs`, each from its own seeded generator."""
    for spec in specs:
        if spec.init == "zeros":
            tensor = torch.zeros(spec.shape)
        elif spec.init == "ones":
            tensor = torch.ones(spec.shape)
        elif spec.init == "normal":
            gen = torch.Generator(device="cpu").manual_seed(tensor_seed(seed, spec.name))
            tensor = torch.randn(spec.shape, generator=gen, dtype=torch.float32, device="cpu")
            tensor.mul_(INIT_STD)
        else:
            raise ValueError(f"unknown init {spec.init!r} for {spec.name}")
        yield spec.name, tensor


def linear_specs(name: str, out_features: int, in_features: int, bias: bool) -> list[WeightSpec]:
    """Specs of an nn.Linear checkpoint entry: weight [out, in] and maybe bias [out]."""
    specs = [WeightSpec(f"{name}.weight", (out_features, in_features), "normal")]
    if bias:
        specs.append(WeightSpec(f"{name}.bias", (out_features,), "zeros"))
    return specs


def norm_specs(name: str, size: int, bias: bool) -> list[WeightSpec]:
    """Specs of a LayerNorm (weight + bias) or RMSNorm (weight only)."""
    specs = [WeightSpec(f"{name}.weight", (size,), "ones")]
    if bias:
        specs.append(WeightSpec(f"{name}.bias", (size,), "zeros"))
    return specs
