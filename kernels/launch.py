"""Host-side launch helpers shared by the kernels: shape checks, arguments, tile sizes
and how to fill the GPU.

Plain Python and torch: importing it never imports Triton.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

DEFAULT_NUM_SMS = 132  # H100 SXM; used when no CUDA device can be asked
LOG2E = 1.4426950408889634  # the attention kernels' softmax is in the log2 domain
ROW_GROUP_MAX = 1  # grouped query heads up to which paged decode multiplies without tl.dot


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms_of(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (``DEFAULT_NUM_SMS`` elsewhere)."""
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _num_sms(index)


def choose_num_splits(
    batch: int,
    num_kv_heads: int,
    max_context: int,
    num_sms: int = DEFAULT_NUM_SMS,
    waves: int = 3,
    min_tokens_per_split: int = 256,
    max_splits: int = 64,
) -> int:
    """How many ranges to cut each context into so the GPU has enough programs.

    Aims for about ``waves * num_sms`` stage-1 programs (B * Hkv * splits), but gives
    no split fewer than ``min_tokens_per_split`` tokens, so each one reads a few tiles
    to amortise its partial-result write and its share of the merge, and uses at most
    ``max_splits``. A batch that already fills the GPU gets 1 (no merge pass at all).
    """
    programs = max(1, batch * num_kv_heads)
    want = -(-waves * num_sms // programs)
    by_length = max(1, -(-max_context // min_tokens_per_split))
    return max(1, min(want, by_length, max_splits))


def fixed_chunk(max_context: int, num_splits: int, block_n: int) -> tuple[int, int]:
    """(tokens per split, splits of the longest context): the context bound cut into
    ``num_splits`` ranges of whole ``block_n`` tiles, so chunks start on a tile."""
    context = max(1, max_context)
    per = -(-context // max(1, num_splits))
    chunk = -(-per // block_n) * block_n
    return chunk, -(-context // chunk)


def choose_chunk(
    batch: int, num_kv_heads: int, max_context: int, block_n: int,
    num_sms: int = DEFAULT_NUM_SMS, max_chunk: int = 2048, max_splits: int = 64,
) -> int:  # fmt: skip
    """Tokens per split that every sequence of a batch is cut by (a multiple of ``block_n``).

    The split count of ``choose_num_splits`` for the longest context, but chunks of at
    most ``max_chunk`` tokens while that needs no more than ``max_splits``: a short
    chunk bounds how long the last program runs, so one long sequence among a full
    GPU's worth of short ones is cut too, for a partial write and merge that cost well
    under 1% of its K/V bytes.
    """
    context = max(1, max_context)
    splits = choose_num_splits(batch, num_kv_heads, context, num_sms, max_splits=max_splits)
    splits = max(splits, min(-(-context // max_chunk), max_splits))
    return fixed_chunk(context, splits, block_n)[0]


def decode_chunking(
    batch: int,
    num_kv_heads: int,
    max_context: int,
    block_n: int,
    num_sms: int = DEFAULT_NUM_SMS,
    num_splits: int | None = None,
) -> tuple[int, int]:
    """Paged decode's (chunk, splits of the longest context: the grid's third side),
    by ``choose_chunk`` or, given ``num_splits``, that many ranges of whole tiles."""
    context = max(1, int(max_context))
    if num_splits is None:
        chunk = choose_chunk(batch, num_kv_heads, context, block_n, num_sms)
    else:
        chunk, _ = fixed_chunk(context, max(1, int(num_splits)), block_n)
    return chunk, -(-context // chunk)


def decode_group_tile(group: int, use_dot: bool | None = None) -> tuple[bool, int]:
    """(whether paged decode's products are tl.dot, rows of its grouped-head tile): a
    tl.dot needs 16 rows, which groups up to ``ROW_GROUP_MAX`` skip by default."""
    if use_dot is None:
        use_dot = group > ROW_GROUP_MAX
    rows = next_pow2(group)
    return use_dot, max(16, rows) if use_dot else rows


def attention_dims(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> tuple[int, int, int, int, int]:
    """(q rows, query heads, head dim, block size, KV heads), once q and the caches agree."""
    rows, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(f"caches {tuple(k_cache.shape)} do not match q {tuple(q.shape)}")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not group onto {num_kv_heads} KV heads")
    return rows, num_heads, head_dim, block_size, num_kv_heads


def attention_args(
    paged: tuple[torch.Tensor, ...],
    extra: tuple[torch.Tensor, ...],
    scale: float,
    count: int,
    strided: tuple[torch.Tensor, ...],
) -> tuple[Any, ...]:
    """An attention kernel's positional arguments, in its order.

    ``paged`` is (q, k_cache, v_cache, block_tables, context_lens), the tensors both
    kernels take first; then the kernel's ``extra`` tensors, the softmax scale in the
    log2 domain, ``count`` (splits or query tiles), the strides of all of ``paged`` but
    the lengths, and those of ``strided``.
    """
    strides = [n for t in (*paged[:4], *strided) for n in t.stride()]
    return (*paged, *extra, float(scale) * LOG2E, count, *strides)


def attention_constants(
    q: torch.Tensor, k_cache: torch.Tensor, block_n: int | None
) -> dict[str, Any]:
    """The compile-time constants both attention kernels take (tiles padded to powers of two)."""
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    block_d = max(16, next_pow2(head_dim))
    if block_n is None:
        block_n = 64 if block_d <= 128 else 32
    return {
        "HEAD_DIM": head_dim,
        "GROUP": num_heads // num_kv_heads,
        "BLOCK_SIZE": block_size,
        "BLOCK_D": block_d,
        "BLOCK_N": block_n,
        "UPCAST": q.device.type != "cuda",  # the interpreter's tl.dot mis-multiplies bf16
        "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
    }
