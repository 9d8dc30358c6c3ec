"""Token embedding and LM head sharded over the vocabulary.

The vocabulary is padded to a multiple of the tensor-parallel size and each rank
owns a contiguous range of rows. The embedding looks up the ids in its range,
zeroes the rest and all-reduces; the LM head computes logits for its range and
all-gathers them, then drops the padding columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fsd.layers.linear import ShardId, copy_checked, set_weight_attrs
from fsd.layers.parallel_state import get_tp_rank, get_tp_world_size, tp_all_gather, tp_all_reduce


class VocabParallelEmbedding(nn.Module):
    """Embedding table [vocab, dim] split by rows over the tensor-parallel ranks."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = get_tp_rank()
        self.tp_size = get_tp_world_size()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        padded = -(-num_embeddings // self.tp_size) * self.tp_size
        self.num_embeddings_per_partition = padded // self.tp_size
        self.vocab_start = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end = self.vocab_start + self.num_embeddings_per_partition
        # Rows of this shard that hold real tokens (the last shard may hold padding).
        self.num_valid = max(0, min(self.vocab_end, num_embeddings) - self.vocab_start)
        self.weight = nn.Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim), requires_grad=False
        )
        set_weight_attrs(self.weight, self.weight_loader)

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        expected = (self.num_embeddings, self.embedding_dim)
        if tuple(loaded.shape) != expected:
            raise ValueError(f"expected shape {expected}, got {tuple(loaded.shape)}")
        rows = loaded.narrow(0, self.vocab_start, self.num_valid)
        copy_checked(param.narrow(0, 0, self.num_valid), rows)
        with torch.no_grad():
            param[self.num_valid :].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = (input_ids - self.vocab_start) * mine
        out = F.embedding(local_ids, self.weight)
        out = out * mine.unsqueeze(-1).to(out.dtype)
        return tp_all_reduce(out)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, "
            f"rows=[{self.vocab_start}, {self.vocab_end}), tp={self.tp_size}"
        )


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection to the vocabulary; may share its weight with the embedding."""

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        """Use the embedding's weight (tie_word_embeddings); the shards line up."""
        if (embedding.num_embeddings, embedding.embedding_dim) != (
            self.num_embeddings,
            self.embedding_dim,
        ):
            raise ValueError("cannot tie an LM head to an embedding of a different shape")
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, dim] -> logits [N, vocab] (all ranks get the full vocabulary)."""
        logits = F.linear(hidden, self.weight)
        if self.tp_size > 1:
            logits = tp_all_gather(logits, dim=-1)
        if logits.shape[-1] != self.num_embeddings:
            logits = logits[..., : self.num_embeddings]
        return logits
