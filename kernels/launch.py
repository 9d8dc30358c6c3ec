"""Launch helpers shared by the kernels: tile sizes and how to fill the GPU.

Plain Python and torch: importing it never imports Triton.
"""

from __future__ import annotations

import functools

import torch

DEFAULT_NUM_SMS = 132  # H100 SXM; used when no CUDA device can be asked


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
