"""Linear layers sharded for tensor parallelism (Megatron style).

Every parameter carries `weight_loader(param, loaded_weight, shard_id=None)`, which
takes the *full* tensor from a HuggingFace checkpoint and copies this rank's slice
into the parameter, and `shard_ids`, the ids a checkpoint must provide for it
(`(None,)` for a plain parameter, `("q", "k", "v")` for a merged QKV weight,
`(0, 1)` for gate/up). A wrong shape raises ValueError naming both shapes; the
model's `load_weights` adds the checkpoint name.

Column-parallel layers split the output features over ranks; row-parallel layers
split the input features and all-reduce their output, so a column layer followed by
a row layer needs a single collective.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fsd.layers.parallel_state import (
    divide,
    get_tp_rank,
    get_tp_world_size,
    tp_all_gather,
    tp_all_reduce,
)

ShardId = str | int | None
WeightLoader = Callable[[torch.Tensor, torch.Tensor, ShardId], None]


def copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)` after checking that the shapes agree exactly."""
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"expected shape {tuple(dst.shape)}, got {tuple(src.shape)}")
    with torch.no_grad():
        dst.copy_(src)


def default_weight_loader(
    param: torch.Tensor, loaded: torch.Tensor, shard_id: ShardId = None
) -> None:
    """A replicated parameter: the checkpoint tensor is copied whole."""
    if shard_id is not None:
        raise ValueError(f"unexpected shard id {shard_id!r} for a replicated parameter")
    copy_checked(param, loaded)


def set_weight_attrs(
    param: nn.Parameter, loader: WeightLoader, shard_ids: Sequence[ShardId] = (None,)
) -> None:
    """Attach the loading hooks that `load_weights` looks for."""
    param.weight_loader = loader  # type: ignore[attr-defined]
    param.shard_ids = tuple(shard_ids)  # type: ignore[attr-defined]


def _narrow_full(loaded: torch.Tensor, dim: int, full: int, start: int, size: int) -> torch.Tensor:
    """This rank's slice [start, start + size) of a checkpoint tensor of `full` rows."""
    if loaded.dim() <= dim or loaded.shape[dim] != full:
        raise ValueError(f"expected {full} along dim {dim}, got shape {tuple(loaded.shape)}")
    return loaded.narrow(dim, start, size)


class _LinearBase(nn.Module):
    """Holds weight [out_local, in_local] and an optional bias [out_local or out]."""

    def __init__(
        self, in_local: int, out_local: int, bias: bool, bias_size: int | None = None
    ) -> None:
        super().__init__()
        self.tp_rank = get_tp_rank()
        self.tp_size = get_tp_world_size()
        self.weight = nn.Parameter(torch.empty(out_local, in_local), requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.empty(bias_size or out_local), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def _load_shard(
        self, param: torch.Tensor, loaded: torch.Tensor, dim: int, full: int, size: int
    ) -> None:
        """Copy this rank's `size` of a checkpoint tensor `full` long along `dim`."""
        copy_checked(param, _narrow_full(loaded, dim, full, self.tp_rank * size, size))

    def extra_repr(self) -> str:
        out, inp = self.weight.shape
        return f"in_local={inp}, out_local={out}, bias={self.bias is not None}, tp={self.tp_size}"


class ReplicatedLinear(_LinearBase):
    """A linear layer every rank holds whole (OPT's project_in / project_out)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size, bias)
        for p in self.parameters():
            set_weight_attrs(p, default_weight_loader)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear(_LinearBase):
    """Y = X A^T + b with A split by rows (output features) over the ranks."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = True, gather_output: bool = False
    ) -> None:
        tp = get_tp_world_size()
        self.output_size = output_size
        self.output_size_per_partition = divide(output_size, tp, "output size")
        super().__init__(input_size, self.output_size_per_partition, bias)
        self.gather_output = gather_output
        for p in self.parameters():
            set_weight_attrs(p, self.weight_loader)

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        self._load_shard(param, loaded, 0, self.output_size, self.output_size_per_partition)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return tp_all_gather(y, dim=-1) if self.gather_output else y


class RowParallelLinear(_LinearBase):
    """Y = X A^T + b with A split by columns (input features); the output is all-reduced."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        input_is_parallel: bool = True,
        reduce_results: bool = True,
    ) -> None:
        tp = get_tp_world_size()
        self.input_size = input_size
        self.input_size_per_partition = divide(input_size, tp, "input size")
        super().__init__(self.input_size_per_partition, output_size, bias, bias_size=output_size)
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        set_weight_attrs(self.weight, self.weight_loader)
        if self.bias is not None:
            set_weight_attrs(self.bias, default_weight_loader)

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        self._load_shard(param, loaded, 1, self.input_size, self.input_size_per_partition)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel and self.tp_size > 1:
            size = self.input_size_per_partition
            x = x.narrow(-1, self.tp_rank * size, size)
        # The bias is added by rank 0 only, so the all-reduce counts it once.
        bias = self.bias if self.tp_rank == 0 else None
        y = F.linear(x, self.weight, bias)
        return tp_all_reduce(y) if self.reduce_results else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (Llama's gate_proj + up_proj).

    Shard id i loads the i-th output; each rank keeps its slice of every output,
    laid out [out0_local, out1_local, ...].
    """

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = True) -> None:
        self.output_sizes = list(output_sizes)
        tp = get_tp_world_size()
        self.local_sizes = [divide(s, tp, "merged output size") for s in self.output_sizes]
        super().__init__(input_size, sum(self.output_sizes), bias)
        for p in self.parameters():
            set_weight_attrs(p, self.weight_loader, range(len(self.output_sizes)))

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        if shard_id is None:  # a checkpoint that already stores the outputs fused
            _narrow_full(loaded, 0, sum(self.output_sizes), 0, 0)
            for i, part in enumerate(loaded.split(self.output_sizes, dim=0)):
                self.weight_loader(param, part, i)
            return
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"shard id {shard_id!r} out of range for {len(self.output_sizes)} outputs"
            )
        size = self.local_sizes[shard_id]
        offset = sum(self.local_sizes[:shard_id])
        full = self.output_sizes[shard_id]
        self._load_shard(param.narrow(0, offset, size), loaded, 0, full, size)


class QKVParallelLinear(ColumnParallelLinear):
    """Query, key and value projections in one matmul, sharded by heads.

    Each rank holds num_heads / tp query heads. With fewer kv heads than ranks the kv
    heads are replicated: each rank holds one, shared by tp / num_kv_heads ranks.
    Output layout per rank: [q (heads_local * d) | k (kv_local * d) | v (kv_local * d)].
    """

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = True
    ) -> None:
        tp = get_tp_world_size()
        self.head_dim = head_dim
        self.total_num_heads = num_heads
        self.total_num_kv_heads = num_kv_heads
        self.num_heads = divide(num_heads, tp, "number of attention heads")
        if tp >= num_kv_heads:
            self.num_kv_heads = 1
            self.kv_replicas = divide(tp, num_kv_heads, "tensor-parallel size vs kv heads")
        else:
            self.num_kv_heads = divide(num_kv_heads, tp, "number of kv heads")
            self.kv_replicas = 1
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        # The parent's "output size" is the per-rank size times tp, so its local size is right.
        super().__init__(hidden_size, (self.q_size + 2 * self.kv_size) * tp, bias)
        for p in self.parameters():
            set_weight_attrs(p, self.weight_loader, ("q", "k", "v"))

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: ShardId = None
    ) -> None:
        d = self.head_dim
        full_q, full_kv = self.total_num_heads * d, self.total_num_kv_heads * d
        if shard_id is None:  # a fused q|k|v checkpoint tensor
            _narrow_full(loaded, 0, full_q + 2 * full_kv, 0, 0)
            for sid, part in zip(
                "qkv", loaded.split([full_q, full_kv, full_kv], dim=0), strict=True
            ):
                self.weight_loader(param, part, sid)
            return
        if shard_id == "q":
            dst = param.narrow(0, 0, self.q_size)
            src = _narrow_full(loaded, 0, full_q, self.tp_rank * self.q_size, self.q_size)
        elif shard_id in ("k", "v"):
            offset = self.q_size if shard_id == "k" else self.q_size + self.kv_size
            dst = param.narrow(0, offset, self.kv_size)
            start = (self.tp_rank // self.kv_replicas) * self.kv_size
            src = _narrow_full(loaded, 0, full_kv, start, self.kv_size)
        else:
            raise ValueError(f"shard id must be 'q', 'k' or 'v', got {shard_id!r}")
        copy_checked(dst, src)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split this rank's output into q, k, v."""
        return qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
