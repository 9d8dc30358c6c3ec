"""Device-side code shared by the Triton kernels, and how each kernel module JIT-wraps.

``attend`` is the loop both attention kernels run: an online softmax over a range of
keys read in tiles through the block table. Triton inlines such helpers into the
kernels that call them, so sharing one adds no call and no other work.

Like the kernel modules, this one imports Triton only on first use: ``jit_loader``
gives each kernel module a cached loader that then binds ``tl`` and JIT-wraps the
helpers here and the module's own functions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

tl: Any = None  # triton.language, bound on first use


def attend(
    q, q_pos, start, end, table, k_base, v_base, scale_log2,
    stride_btn, stride_kb, stride_ks, stride_kd, stride_vb, stride_vs, stride_vd,
    ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    USE_DOT: tl.constexpr = True,
):  # fmt: skip
    """Online softmax of the ``ROWS`` rows of ``q`` over one sequence's keys ``start ..< end``.

    ``table`` is the sequence's block-table row, ``k_base`` and ``v_base`` the caches at
    its KV head. Keys are walked in ``BLOCK_N`` tiles; each token's cache block comes
    from the table (``position // BLOCK_SIZE``), so any block size is read the same way
    and a tile may span several blocks; ``start`` must be a multiple of ``BLOCK_N``, so
    each distinct block id is loaded once per tile (``_tile_blocks``). Scores are in
    the log2 domain (``scale_log2`` folds in log2(e)), the running max and sum in fp32.
    With ``q_pos`` (each row's absolute position) a row sees the keys up to its own
    position; with ``None``, every key in range. With ``USE_DOT`` both products are
    ``tl.dot`` (tensor cores, at least 16 rows); without, ``_rows_dot`` and
    ``_rows_weighted`` make them row by row on the CUDA cores, so a few rows pay for no
    padding. Returns (acc, m_i, l_i): the unnormalised output [ROWS, BLOCK_D] and the
    running max and sum [ROWS].
    """
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_mask = offs_d < HEAD_DIM
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for tile in range(start, end, BLOCK_N):
        pos = tile + offs_n
        n_mask = pos < end
        block = _tile_blocks(table, tile, pos, end, n_mask, stride_btn, BLOCK_SIZE, BLOCK_N)
        krow = block.to(tl.int64) * stride_kb + (pos % BLOCK_SIZE) * stride_ks
        # No padded columns: a per-row mask lets loads vectorise. (A constexpr `if`, not a
        # ternary, so only one branch is ever compiled.)
        if HEAD_DIM == BLOCK_D:  # noqa: SIM108
            kv_mask = n_mask[:, None]
        else:
            kv_mask = n_mask[:, None] & d_mask[None, :]
        k = load_tile(k_base, krow, offs_d, stride_kd, kv_mask, UPCAST)
        s = _scores(q, k, pos, q_pos, n_mask, scale_log2, ROWS, BLOCK_N, DOT_PRECISION, USE_DOT)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        vrow = block.to(tl.int64) * stride_vb + (pos % BLOCK_SIZE) * stride_vs
        v = load_tile(v_base, vrow, offs_d, stride_vd, kv_mask, UPCAST)
        if USE_DOT:
            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        else:
            pv = _rows_weighted(p, v, ROWS, BLOCK_D)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


def _scores(q, k, pos, q_pos, n_mask, scale_log2, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
            DOT_PRECISION: tl.constexpr, USE_DOT: tl.constexpr):  # fmt: skip
    """A tile's scores [ROWS, BLOCK_N] in the log2 domain, ``-inf`` where a row may not
    see the key: past the range's end, or (with ``q_pos``) past the row's own position."""
    if USE_DOT:
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [ROWS, N]
    else:
        s = _rows_dot(q, k, ROWS, BLOCK_N)
    s = s * scale_log2
    if q_pos is None:  # noqa: SIM108
        visible = n_mask[None, :]
    else:  # causal; key 0 is visible to every row, so the first tile leaves m_i finite
        visible = (pos[None, :] <= q_pos[:, None]) & n_mask[None, :]
    return tl.where(visible, s, float("-inf"))


def normalised(acc, l_i):
    """``attend``'s output divided by its running sum (a row that saw no key stays 0)."""
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    return acc / l_safe[:, None]


def _tile_blocks(table, tile, pos, end, n_mask, stride_btn, BLOCK_SIZE: tl.constexpr,
                 BLOCK_N: tl.constexpr):  # fmt: skip
    """The cache block of each of a tile's ``BLOCK_N`` tokens (``pos``), each distinct
    block id loaded once when tiles start on a page (callers start them on a multiple
    of ``BLOCK_N``)."""
    if BLOCK_N % BLOCK_SIZE == 0:  # whole pages per tile
        page = tile // BLOCK_SIZE + tl.arange(0, BLOCK_N // BLOCK_SIZE)
        ids = tl.load(table + page * stride_btn, mask=page * BLOCK_SIZE < end, other=0)
        pages = tl.broadcast_to(ids[:, None], (BLOCK_N // BLOCK_SIZE, BLOCK_SIZE))
        block = tl.reshape(pages, (BLOCK_N,))
    elif BLOCK_SIZE % BLOCK_N == 0:  # the whole tile in one page
        block = tl.zeros([BLOCK_N], tl.int32) + tl.load(table + (tile // BLOCK_SIZE) * stride_btn)
    else:
        block = tl.load(table + (pos // BLOCK_SIZE) * stride_btn, mask=n_mask, other=0)
    return block


def _rows_dot(q, k, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """``q @ k.T`` ([ROWS, BLOCK_N], fp32) one row at a time: a multiply and a sum over
    the head dim per row, for row counts a ``tl.dot`` would pad to 16."""
    q = q.to(tl.float32)
    k = k.to(tl.float32)
    rows = tl.arange(0, ROWS)[:, None]
    s = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for r in tl.static_range(ROWS):
        q_r = tl.sum(tl.where(rows == r, q, 0.0), axis=0)  # [BLOCK_D]
        s = tl.where(rows == r, tl.sum(k * q_r[None, :], axis=1)[None, :], s)
    return s


def _rows_weighted(p, v, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """``p @ v`` ([ROWS, BLOCK_D], fp32) one row at a time, as ``_rows_dot``."""
    v = v.to(tl.float32)
    rows = tl.arange(0, ROWS)[:, None]
    out = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for r in tl.static_range(ROWS):
        p_r = tl.sum(tl.where(rows == r, p, 0.0), axis=0)  # [BLOCK_N]
        out = tl.where(rows == r, tl.sum(v * p_r[:, None], axis=0)[None, :], out)
    return out


def load_tile(base, rows, offs_d, stride_d, mask, UPCAST: tl.constexpr):
    """A [N, BLOCK_D] tile of q, K or V (row offsets ``rows``), in fp32 when ``UPCAST``."""
    tile = tl.load(base + rows[:, None] + offs_d[None, :] * stride_d, mask=mask, other=0.0)
    if UPCAST:
        tile = tile.to(tl.float32)
    return tile


_HELPERS = ("attend", "_scores", "normalised", "_tile_blocks", "_rows_dot", "_rows_weighted")
_HELPERS += ("load_tile",)


def jit_loader(
    namespace: dict[str, Any], *kernels: str, helpers: tuple[str, ...] = ()
) -> Callable[[], tuple[Any, ...]]:
    """A cached loader of a kernel module's ``kernels`` (``namespace`` is its globals()).

    Its first call imports Triton, binds ``tl`` here and in the module, JIT-wraps this
    module's helpers and the module's ``helpers`` in place (a kernel calls a helper by
    its global name, which must then be the JIT wrapper), and returns the kernels'
    JIT wrappers, in order.
    """

    @functools.cache
    def load() -> tuple[Any, ...]:
        _wrap_own_helpers()
        _wrap(namespace, helpers)
        return _wrap(namespace, kernels, in_place=False)

    return load


@functools.cache
def _wrap_own_helpers() -> None:
    _wrap(globals(), _HELPERS)


def _wrap(
    namespace: dict[str, Any], names: tuple[str, ...], in_place: bool = True
) -> tuple[Any, ...]:
    """Bind ``tl`` in ``namespace`` and JIT-wrap its ``names`` (rebound there if in place)."""
    import triton
    import triton.language as language

    namespace["tl"] = language
    wrapped = tuple(triton.jit(namespace[name]) for name in names)
    if in_place:
        namespace.update(zip(names, wrapped, strict=True))
    return wrapped
