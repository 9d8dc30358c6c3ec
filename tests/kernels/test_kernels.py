"""Paged-attention kernels: references against dense attention, Triton against references.

Without a GPU the Triton kernels run on CPU tensors in Triton's interpreter (see
conftest.py), which is slow, so long contexts use small head_dim and few heads. Unused
cache slots are filled with NaN: any read past a sequence's context shows up.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from fsd.kernels import paged_decode, paged_prefill, reference, store_kv
from fsd.kernels.launch import choose_num_splits

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
uses_triton = pytest.mark.usefixtures("triton_ready")
half_precision = pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])


def on_gpu(test: Callable) -> Callable:
    """A GPU-only check: marked `gpu`, skipped without CUDA or Triton."""
    return gpu(needs_cuda(uses_triton(test)))


# (atol, rtol) of a kernel against the reference, by dtype.
TOL = {
    torch.float32: (2e-5, 1e-4),
    torch.float16: (4e-3, 1e-2),
    torch.bfloat16: (3e-2, 4e-2),
}


# ----------------------------------------------------------------------------- helpers


@dataclass
class Paged:
    """A batch of sequences' K/V laid out in a paged cache."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor


def rand(gen: torch.Generator, *shape: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def page(
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    block_size: int,
    gen: torch.Generator,
    *,
    shuffle: bool = True,
    spare_blocks: int = 3,
    cache: torch.Tensor | None = None,
) -> Paged:
    """Lay each sequence's logical K/V ([C, Hkv, D]) into (shuffled) physical blocks.

    Slots that no token owns hold NaN. ``cache`` may supply the [2, NB, BS, Hkv, D]
    storage (e.g. a non-contiguous view) to write into.
    """
    counts = [math.ceil(k.shape[0] / block_size) for k in keys]
    total = sum(counts) + spare_blocks
    hkv, dim = keys[0].shape[1:]
    dtype, device = keys[0].dtype, keys[0].device
    if cache is None:
        cache = torch.empty((2, total, block_size, hkv, dim), dtype=dtype, device=device)
    cache.fill_(float("nan"))
    k_cache, v_cache = cache[0], cache[1]
    order = torch.randperm(total, generator=gen) if shuffle else torch.arange(total)
    order = order.tolist()
    width = max(counts)
    tables = torch.zeros((len(keys), width), dtype=torch.int32)
    used = 0
    for s, (k, v) in enumerate(zip(keys, values, strict=True)):
        blocks = order[used : used + counts[s]]
        used += counts[s]
        tables[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        pos = torch.arange(k.shape[0], device=device)
        phys = torch.tensor(blocks, dtype=torch.int64, device=device)[pos // block_size]
        k_cache[phys, pos % block_size] = k
        v_cache[phys, pos % block_size] = v
    lens = torch.tensor([k.shape[0] for k in keys], dtype=torch.int32)
    return Paged(k_cache, v_cache, tables.to(device), lens.to(device))


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Plain softmax(q k^T) v in float64: q [L, Hq, D] are the last L of the C keys, causal."""
    num_queries, num_heads, _ = q.shape
    ctx = k.shape[0]
    group = num_heads // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("lhd,chd->hlc", q.double(), kk) * scale
    q_pos = torch.arange(ctx - num_queries, ctx, device=q.device)
    hidden = torch.arange(ctx, device=q.device)[None, :] > q_pos[:, None]
    scores = scores.masked_fill(hidden[None], float("-inf"))
    return torch.einsum("hlc,chd->lhd", torch.softmax(scores, dim=-1), vv)


def make_seqs(
    gen: torch.Generator, lens: list[int], hkv: int, dim: int, dtype, device
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    keys = [rand(gen, n, hkv, dim, dtype=dtype, device=device) for n in lens]
    values = [rand(gen, n, hkv, dim, dtype=dtype, device=device) for n in lens]
    return keys, values


def query_start_loc(q_lens: list[int], device) -> torch.Tensor:
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    return torch.tensor(starts, dtype=torch.int32, device=device)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOL[dtype]
    assert actual.dtype == dtype
    assert not torch.isnan(actual).any()
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol)


DECODE_LENS = [1, 15, 16, 17, 1025]
PREFILL_Q_LENS = [5, 17, 1]
PREFILL_CTX = [5, 40, 33]


# ----------------------------------------------------------------------------- references


def test_package_imports_and_references_work_without_triton() -> None:
    """fsd.kernels must not need Triton until a Triton kernel is called."""
    code = (
        "import sys\n"
        "import torch\n"
        "from fsd.kernels import paged_decode, paged_prefill, reference, store_kv\n"
        "assert 'triton' not in sys.modules, 'importing fsd.kernels imported triton'\n"
        "sys.modules['triton'] = None  # as if it were not installed\n"
        "c = torch.zeros(2, 4, 1, 16)\n"
        "reference.store_kv_ref(torch.ones(1, 1, 16), torch.ones(1, 1, 16), c, c, "
        "torch.tensor([5]))\n"
        "try:\n"
        "    store_kv(torch.ones(1, 1, 16), torch.ones(1, 1, 16), c, c, torch.tensor([5]))\n"
        "except ImportError:\n"
        "    print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("block_size", [1, 16, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_reference_decode_matches_dense(block_size: int, group: int) -> None:
    gen = torch.Generator().manual_seed(1)
    hkv, dim, scale = 2, 32, 0.17
    keys, values = make_seqs(gen, DECODE_LENS, hkv, dim, torch.float32, "cpu")
    paged = page(keys, values, block_size, gen)
    q = rand(gen, len(DECODE_LENS), hkv * group, dim)
    out = reference.paged_decode_ref(
        q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens, scale
    )
    for s in range(len(DECODE_LENS)):
        want = dense_attention(q[s : s + 1], keys[s], values[s], scale)[0]
        torch.testing.assert_close(out[s].double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_reference_prefill_matches_dense(block_size: int, group: int) -> None:
    gen = torch.Generator().manual_seed(2)
    hkv, dim, scale = 2, 16, 0.25
    q_lens, ctx = [*PREFILL_Q_LENS, 64], [*PREFILL_CTX, 1025]
    keys, values = make_seqs(gen, ctx, hkv, dim, torch.float32, "cpu")
    paged = page(keys, values, block_size, gen)
    q = rand(gen, sum(q_lens), hkv * group, dim)
    qsl = query_start_loc(q_lens, "cpu")
    out = reference.paged_prefill_ref(
        q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens, qsl, scale
    )
    for s in range(len(q_lens)):
        a, b = int(qsl[s]), int(qsl[s + 1])
        want = dense_attention(q[a:b], keys[s], values[s], scale)
        torch.testing.assert_close(out[a:b].double(), want, atol=1e-5, rtol=1e-5)


def test_reference_store_kv_skips_negative_slots_and_writes_views() -> None:
    gen = torch.Generator().manual_seed(3)
    big = torch.zeros(3, 2, 6, 4, 2, 8)  # [layers, k/v, NB, BS, Hkv, D]
    k_cache, v_cache = big[1, 0], big[1, 1]
    key, value = rand(gen, 4, 2, 8), rand(gen, 4, 2, 8)
    slots = torch.tensor([5, -1, 0, 23], dtype=torch.int64)
    reference.store_kv_ref(key, value, k_cache, v_cache, slots)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k_cache[slot // 4, slot % 4], key[t])
            assert torch.equal(v_cache[slot // 4, slot % 4], value[t])
    assert int((big != 0).sum()) == 3 * 2 * 2 * 8  # three tokens, K and V, nothing else
    assert not big[0].any() and not big[2].any()


# ----------------------------------------------------------------------------- store_kv


@uses_triton
@pytest.mark.parametrize(
    ("src_dtype", "dtype"),
    [
        (torch.float32, torch.float32),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float16),  # cast on store
    ],
)
def test_store_kv_matches_reference(src_dtype, dtype, device: torch.device) -> None:
    gen = torch.Generator().manual_seed(4)
    layers, nb, bs, hkv, dim = 2, 5, 16, 4, 80
    num_tokens = 40
    # [layers, NB, k/v, BS, Hkv, D] seen as [layers, k/v, NB, ...]: strided cache views.
    expected = torch.zeros(layers, nb, 2, bs, hkv, dim, dtype=dtype, device=device)
    expected = expected.transpose(1, 2)
    actual = expected.clone()
    assert not actual[1, 0].is_contiguous()
    # Non-contiguous inputs too: K and V are slices of one fused projection.
    kv = rand(gen, num_tokens, 2 * hkv, dim, dtype=src_dtype, device=device)
    key, value = kv[:, :hkv], kv[:, hkv:]
    slots = torch.randperm(nb * bs, generator=gen)[:num_tokens].to(device)
    slots[::7] = -1
    reference.store_kv_ref(key, value, expected[1, 0], expected[1, 1], slots)
    store_kv(key, value, actual[1, 0], actual[1, 1], slots)
    assert torch.equal(actual, expected)
    assert actual[1].any() and not actual[0].any()


@uses_triton
def test_store_kv_empty_batch(device: torch.device) -> None:
    cache = torch.zeros(2, 4, 16, 2, 16, device=device)
    empty = torch.empty(0, 2, 16, device=device)
    store_kv(empty, empty, cache[0], cache[1], torch.empty(0, dtype=torch.int64, device=device))
    assert not cache.any()


# ----------------------------------------------------------------------------- paged decode


def _decode_case(
    device, dtype, group: int, lens: list[int], block_size: int, dim: int, hkv: int = 2, seed=5
):
    gen = torch.Generator().manual_seed(seed)
    keys, values = make_seqs(gen, lens, hkv, dim, dtype, device)
    paged = page(keys, values, block_size, gen)
    q = rand(gen, len(lens), hkv * group, dim, dtype=dtype, device=device)
    return q, paged


def _run_decode(q, paged: Paged, scale: float, fn=paged_decode, **kw) -> torch.Tensor:
    return fn(q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens, scale, **kw)


@uses_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_matches_reference(dtype, group: int, device) -> None:
    q, paged = _decode_case(device, dtype, group, DECODE_LENS, block_size=16, dim=32)
    out = _run_decode(q, paged, 0.2)
    assert_close(out, _run_decode(q, paged, 0.2, reference.paged_decode_ref), dtype)


@uses_triton
def test_decode_bf16(device) -> None:
    q, paged = _decode_case(device, torch.bfloat16, 4, [3, 16, 300], block_size=16, dim=32)
    out = _run_decode(q, paged, 0.2)
    assert_close(out, _run_decode(q, paged, 0.2, reference.paged_decode_ref), torch.bfloat16)


@uses_triton
@pytest.mark.parametrize("num_splits", [1, 2, 5, 64])
def test_decode_any_split_count_gives_the_same_answer(num_splits: int, device) -> None:
    # 64 splits of a 300-token context leave most splits empty for the short sequences.
    q, paged = _decode_case(device, torch.float32, 4, [1, 17, 300], block_size=16, dim=16)
    out = _run_decode(q, paged, 0.3, num_splits=num_splits)
    assert_close(out, _run_decode(q, paged, 0.3, reference.paged_decode_ref), torch.float32)


@uses_triton
def test_decode_block_size_does_not_change_the_result(device) -> None:
    gen = torch.Generator().manual_seed(6)
    lens, hkv, group, dim = [1, 17, 200], 2, 4, 32
    keys, values = make_seqs(gen, lens, hkv, dim, torch.float32, device)
    q = rand(gen, len(lens), hkv * group, dim, device=device)
    outs = [_run_decode(q, page(keys, values, bs, gen), 0.2, block_n=16) for bs in (1, 16, 128)]
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0], outs[2], atol=1e-5, rtol=1e-5)


@uses_triton
@pytest.mark.parametrize("dim", [16, 64, 80, 128])
def test_decode_head_dims(dim: int, device) -> None:
    q, paged = _decode_case(device, torch.float16, 2, [1, 33], block_size=8, dim=dim, hkv=1)
    scale = dim**-0.5
    out = _run_decode(q, paged, scale)
    assert_close(out, _run_decode(q, paged, scale, reference.paged_decode_ref), torch.float16)


@uses_triton
def test_decode_reads_non_contiguous_views(device) -> None:
    gen = torch.Generator().manual_seed(7)
    lens, hkv, group, dim, bs = [9, 40], 2, 2, 16, 4
    keys, values = make_seqs(gen, lens, hkv, dim, torch.float32, device)
    # [NB, layers, k/v, BS, Hkv, D]: one layer's K cache is a strided view.
    big = torch.empty(20, 3, 2, bs, hkv, dim, device=device)
    paged = page(keys, values, bs, gen, cache=big[:, 1].transpose(0, 1))
    assert not paged.k_cache.is_contiguous()
    qkv = rand(gen, len(lens), 3 * hkv * group * dim, device=device)
    q = qkv[:, : hkv * group * dim].view(len(lens), hkv * group, dim)  # row stride 3x
    out = _run_decode(q, paged, 0.25)
    want = [dense_attention(q[s : s + 1], keys[s], values[s], 0.25)[0] for s in range(2)]
    assert_close(out, torch.stack(want), torch.float32)


@uses_triton
def test_decode_empty_batch(device) -> None:
    q, paged = _decode_case(device, torch.float32, 1, [4], block_size=4, dim=16)
    out = paged_decode(
        q[:0], paged.k_cache, paged.v_cache, paged.block_tables[:0], paged.context_lens[:0], 1.0
    )
    assert out.shape == (0, *q.shape[1:])


def test_choose_num_splits() -> None:
    # Few sequences and long contexts: split enough to cover ~3 waves of SMs.
    assert choose_num_splits(1, 8, 8192, num_sms=132) == 32
    # Short contexts are not split below min_tokens_per_split.
    assert choose_num_splits(1, 8, 256, num_sms=132) == 1
    assert choose_num_splits(16, 8, 2048, num_sms=132) == 4
    # A big batch already fills the GPU.
    assert choose_num_splits(256, 8, 8192, num_sms=132) == 1
    assert choose_num_splits(1, 1, 10**6, num_sms=132) == 64  # capped
    for batch in (1, 3, 16, 64, 300):
        for ctx in (1, 100, 2048, 32768):
            assert 1 <= choose_num_splits(batch, 8, ctx) <= 64


# ----------------------------------------------------------------------------- paged prefill


def _prefill_case(
    device, dtype, group: int, q_lens, ctx, block_size: int, dim: int, hkv: int = 2, seed=8
):
    gen = torch.Generator().manual_seed(seed)
    keys, values = make_seqs(gen, ctx, hkv, dim, dtype, device)
    paged = page(keys, values, block_size, gen)
    q = rand(gen, sum(q_lens), hkv * group, dim, dtype=dtype, device=device)
    return q, paged, query_start_loc(q_lens, device), keys, values


def _run_prefill(q, paged: Paged, qsl, scale: float, fn=paged_prefill, **kw) -> torch.Tensor:
    return fn(
        q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens, qsl, scale, **kw
    )


@uses_triton
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_prefill_matches_reference(block_size: int, dtype, group: int, device) -> None:
    q, paged, qsl, _, _ = _prefill_case(
        device, dtype, group, PREFILL_Q_LENS, PREFILL_CTX, block_size, dim=32
    )
    out = _run_prefill(q, paged, qsl, 0.2)
    assert_close(out, _run_prefill(q, paged, qsl, 0.2, reference.paged_prefill_ref), dtype)


@uses_triton
def test_prefill_long_context_and_chunked_continuation(device) -> None:
    # A whole 1025-token prompt, a 70-token chunk continuing a 955-token prefix, a 1-token tail.
    q_lens, ctx = [1025, 70, 1], [1025, 1025, 17]
    q, paged, qsl, keys, values = _prefill_case(
        device, torch.float32, 2, q_lens, ctx, block_size=16, dim=16, hkv=1
    )
    out = _run_prefill(q, paged, qsl, 0.25)
    for s in range(len(q_lens)):
        a, b = int(qsl[s]), int(qsl[s + 1])
        want = dense_attention(q[a:b], keys[s], values[s], 0.25)
        assert_close(out[a:b], want, torch.float32)


CHUNK_PREFIXES = [0, 16, 37, 200]  # none, one block, mid-block, many blocks


@pytest.mark.parametrize("chunk", [16, 48, 100, 7])  # block 16: aligned and not
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_prefill_chunk_over_a_cached_prefix(backend: str, chunk: int, device, request) -> None:
    """One chunk per sequence, each continuing a cached prefix of another length (one
    call, as the engine batches them): Triton equals the reference, both equal dense."""
    if backend == "triton":
        request.getfixturevalue("triton_ready")
    hkv, group, dim, scale = 2, 2, 16, 0.3
    ctx = [p + chunk for p in CHUNK_PREFIXES]
    q_lens = [chunk] * len(ctx)
    q, paged, qsl, keys, values = _prefill_case(
        device, torch.float32, group, q_lens, ctx, block_size=16, dim=dim, hkv=hkv, seed=14
    )
    want = _run_prefill(q, paged, qsl, scale, reference.paged_prefill_ref)
    if backend == "triton":
        out = _run_prefill(q, paged, qsl, scale, max_query_len=chunk)
        assert_close(out, want, torch.float32)
    else:
        out = want
    for s in range(len(ctx)):
        a, b = int(qsl[s]), int(qsl[s + 1])
        assert_close(out[a:b], dense_attention(q[a:b], keys[s], values[s], scale), torch.float32)


def whole_sequence_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Causal attention over a whole sequence in one SDPA call: q [N, Hq, D], k/v [N, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    qh = q.permute(1, 0, 2)  # [Hq, N, D]
    kh = k.repeat_interleave(group, dim=1).permute(1, 0, 2)
    vh = v.repeat_interleave(group, dim=1).permute(1, 0, 2)
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    return out.permute(1, 0, 2)


@pytest.mark.parametrize("chunk", [7, 16, 48, 100])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_prefill_chunk_by_chunk_equals_the_whole_sequence_at_once(
    backend: str, group: int, chunk: int, device, request
) -> None:
    """Sequences prefilled together chunk by chunk, as the engine runs them: each step
    stores its chunks' K/V into a NaN-filled paged cache and attends over what is cached
    so far; the pieces put together equal causal SDPA over each whole sequence."""
    if backend == "triton":
        request.getfixturevalue("triton_ready")
        store, prefill = store_kv, paged_prefill
    else:
        store, prefill = reference.store_kv_ref, reference.paged_prefill_ref
    gen = torch.Generator().manual_seed(15)
    lens, hkv, dim, bs, scale = [237, 64, 5, 100], 2, 16, 16, 0.3
    qs = [rand(gen, n, hkv * group, dim, device=device) for n in lens]
    keys, values = make_seqs(gen, lens, hkv, dim, torch.float32, device)
    counts = [math.ceil(n / bs) for n in lens]
    nb = sum(counts) + 2
    cache = torch.full((2, nb, bs, hkv, dim), float("nan"), device=device)
    order = torch.randperm(nb, generator=gen).tolist()
    tables, used = [], 0
    for count in counts:
        tables.append(order[used : used + count])
        used += count
    width = max(counts)
    block_tables = torch.tensor(
        [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device
    )
    outs = [torch.full_like(q, float("nan")) for q in qs]
    done = [0] * len(lens)
    steps = 0
    while any(d < n for d, n in zip(done, lens, strict=True)):
        seqs = [s for s, n in enumerate(lens) if done[s] < n]
        spans = [(done[s], min(done[s] + chunk, lens[s])) for s in seqs]
        slots = [
            tables[s][p // bs] * bs + p % bs
            for s, (a, b) in zip(seqs, spans, strict=True)
            for p in range(a, b)
        ]
        store(
            torch.cat([keys[s][a:b] for s, (a, b) in zip(seqs, spans, strict=True)]),
            torch.cat([values[s][a:b] for s, (a, b) in zip(seqs, spans, strict=True)]),
            cache[0],
            cache[1],
            torch.tensor(slots, dtype=torch.int64, device=device),
        )
        q_lens = [b - a for a, b in spans]
        out = prefill(
            torch.cat([qs[s][a:b] for s, (a, b) in zip(seqs, spans, strict=True)]),
            cache[0],
            cache[1],
            block_tables[seqs],
            torch.tensor([b for _, b in spans], dtype=torch.int32, device=device),
            query_start_loc(q_lens, device),
            scale,
        )
        at = 0
        for s, (a, b) in zip(seqs, spans, strict=True):
            outs[s][a:b] = out[at : at + b - a]
            at += b - a
            done[s] = b
        steps += 1
    assert steps == math.ceil(max(lens) / chunk)
    for s in range(len(lens)):
        want = whole_sequence_sdpa(qs[s], keys[s], values[s], scale)
        assert_close(outs[s], want, torch.float32)


@uses_triton
def test_prefill_block_size_does_not_change_the_result(device) -> None:
    gen = torch.Generator().manual_seed(9)
    q_lens, ctx, hkv, group, dim = [5, 17, 1], [5, 40, 33], 2, 4, 16
    keys, values = make_seqs(gen, ctx, hkv, dim, torch.float32, device)
    q = rand(gen, sum(q_lens), hkv * group, dim, device=device)
    qsl = query_start_loc(q_lens, device)
    one = _run_prefill(q, page(keys, values, 1, gen), qsl, 0.2)
    sixteen = _run_prefill(q, page(keys, values, 16, gen), qsl, 0.2)
    torch.testing.assert_close(one, sixteen, atol=1e-5, rtol=1e-5)


@uses_triton
@pytest.mark.parametrize("dim", [80, 128])
def test_prefill_head_dims(dim: int, device) -> None:
    q, paged, qsl, _, _ = _prefill_case(
        device, torch.float16, 2, [3, 20], [10, 20], block_size=8, dim=dim, hkv=1
    )
    out = _run_prefill(q, paged, qsl, dim**-0.5, max_query_len=20)
    want = _run_prefill(q, paged, qsl, dim**-0.5, reference.paged_prefill_ref)
    assert_close(out, want, torch.float16)


@uses_triton
def test_prefill_bf16(device) -> None:
    q, paged, qsl, _, _ = _prefill_case(
        device, torch.bfloat16, 4, [5, 17], [5, 40], block_size=16, dim=32
    )
    out = _run_prefill(q, paged, qsl, 0.2)
    want = _run_prefill(q, paged, qsl, 0.2, reference.paged_prefill_ref)
    assert_close(out, want, torch.bfloat16)


# ----------------------------------------------------------------------------- together


@uses_triton
def test_store_prefill_decode_pipeline_matches_dense(device) -> None:
    """store_kv then prefill a prompt, store one more token and decode it, all in Triton."""
    gen = torch.Generator().manual_seed(10)
    hkv, group, dim, bs, scale = 2, 4, 16, 16, 0.3
    prompts = [23, 1, 40]
    total = [n + 1 for n in prompts]
    keys, values = make_seqs(gen, total, hkv, dim, torch.float32, device)
    nb = sum(math.ceil(n / bs) for n in total) + 2
    cache = torch.full((2, nb, bs, hkv, dim), float("nan"), device=device)
    order = torch.randperm(nb, generator=gen).tolist()
    tables, used = [], 0
    for n in total:
        count = math.ceil(n / bs)
        tables.append(order[used : used + count])
        used += count
    width = max(len(t) for t in tables)
    block_tables = torch.tensor(
        [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device
    )

    def slots(s: int, positions: range) -> list[int]:
        return [tables[s][p // bs] * bs + p % bs for p in positions]

    # Prefill: all prompt tokens of all sequences in one flat batch.
    prefill_slots = sum((slots(s, range(n)) for s, n in enumerate(prompts)), [])
    store_kv(
        torch.cat([k[:n] for k, n in zip(keys, prompts, strict=True)]),
        torch.cat([v[:n] for v, n in zip(values, prompts, strict=True)]),
        cache[0],
        cache[1],
        torch.tensor(prefill_slots, dtype=torch.int64, device=device),
    )
    q_pre = rand(gen, sum(prompts), hkv * group, dim, device=device)
    qsl = query_start_loc(prompts, device)
    lens = torch.tensor(prompts, dtype=torch.int32, device=device)
    out_pre = paged_prefill(q_pre, cache[0], cache[1], block_tables, lens, qsl, scale)
    for s, n in enumerate(prompts):
        a = int(qsl[s])
        want = dense_attention(q_pre[a : a + n], keys[s][:n], values[s][:n], scale)
        assert_close(out_pre[a : a + n], want, torch.float32)

    # Decode: one new token per sequence.
    new_slots = [slots(s, range(n, n + 1))[0] for s, n in enumerate(prompts)]
    store_kv(
        torch.stack([k[-1] for k in keys]),
        torch.stack([v[-1] for v in values]),
        cache[0],
        cache[1],
        torch.tensor(new_slots, dtype=torch.int64, device=device),
    )
    q_dec = rand(gen, len(prompts), hkv * group, dim, device=device)
    lens = torch.tensor(total, dtype=torch.int32, device=device)
    out_dec = paged_decode(q_dec, cache[0], cache[1], block_tables, lens, scale)
    for s in range(len(prompts)):
        want = dense_attention(q_dec[s : s + 1], keys[s], values[s], scale)[0]
        assert_close(out_dec[s], want, torch.float32)


@uses_triton
def test_paged_attention_layer_triton_matches_torch(device) -> None:
    """The attention layer gives the same answer with the Triton and the torch backends."""
    from fsd.layers.attention import AttentionMetadata, PagedAttention

    gen = torch.Generator().manual_seed(11)
    hq, hkv, dim, bs = 8, 2, 16, 16
    query_lens, context_lens = [1, 1, 7, 20], [9, 33, 7, 25]
    tables = [[3, 0, 5], [1, 6, 7], [2], [4, 8]]
    meta = AttentionMetadata.build(query_lens, context_lens, tables, bs, device=device)
    num_tokens = sum(query_lens)
    q = rand(gen, num_tokens, hq * dim, device=device)
    k = rand(gen, num_tokens, hkv * dim, device=device)
    v = rand(gen, num_tokens, hkv * dim, device=device)
    base = rand(gen, 2, 9, bs, hkv, dim, device=device)  # stale cache contents are finite
    positions = torch.tensor([8, 32, *range(7), *range(5, 25)], device=device)
    cos_sin = rand(gen, 40, dim, device=device)
    for rope in (None, (positions, cos_sin)):  # and with RoPE fused into the store
        outs, caches = [], []
        for backend in ("torch", "triton"):
            cache = base.clone()
            layer = PagedAttention(hq, hkv, dim, dim**-0.5, backend=backend)
            outs.append(layer(q, k, v, (cache[0], cache[1]), meta, rope=rope))
            caches.append(cache)
        torch.testing.assert_close(outs[1], outs[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(caches[1], caches[0], atol=2e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- GPU only


@on_gpu
@half_precision
@pytest.mark.parametrize("block_size", [16, 128])
def test_gpu_decode_realistic(dtype, block_size: int) -> None:
    lens = [1, 100, 2048, 4097, 513, 16, 17, 3000]
    q, paged = _decode_case("cuda", dtype, 4, lens, block_size=block_size, dim=128, hkv=8)
    for splits in (None, 1, 7):
        out = _run_decode(q, paged, 128**-0.5, num_splits=splits)
        assert_close(out, _run_decode(q, paged, 128**-0.5, reference.paged_decode_ref), dtype)


@on_gpu
@half_precision
@pytest.mark.parametrize("group", [1, 8])
def test_gpu_prefill_realistic(dtype, group: int) -> None:
    q_lens, ctx = [1000, 37, 1, 512], [1000, 2100, 64, 4096]
    q, paged, qsl, _, _ = _prefill_case(
        "cuda", dtype, group, q_lens, ctx, block_size=16, dim=128, hkv=4
    )
    out = _run_prefill(q, paged, qsl, 128**-0.5)
    assert_close(out, _run_prefill(q, paged, qsl, 128**-0.5, reference.paged_prefill_ref), dtype)


@on_gpu
@half_precision
def test_gpu_store_kv(dtype) -> None:
    gen = torch.Generator().manual_seed(13)
    nb, bs, hkv, dim = 64, 16, 8, 128
    expected = torch.zeros(2, nb, bs, hkv, dim, dtype=dtype, device="cuda")
    actual = expected.clone()
    key = rand(gen, 500, hkv, dim, dtype=dtype, device="cuda")
    value = rand(gen, 500, hkv, dim, dtype=dtype, device="cuda")
    slots = torch.randperm(nb * bs, generator=gen)[:500].cuda()
    slots[::5] = -1
    reference.store_kv_ref(key, value, expected[0], expected[1], slots)
    store_kv(key, value, actual[0], actual[1], slots)
    assert torch.equal(actual, expected)
