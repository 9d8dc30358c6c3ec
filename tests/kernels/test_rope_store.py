"""RoPE fused with the K/V store: the kernel against its reference, the reference
against the rotary layer and store it replaces (the same rounding, so equal)."""

from __future__ import annotations

import pytest
import torch

from fsd.kernels import reference, rope_store
from fsd.layers.rotary import RotaryEmbedding

uses_triton = pytest.mark.usefixtures("triton_ready")
pytestmark = pytest.mark.gpu  # also run on the device machine (scripts/gpu-check.sh)
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 2e-2)}


def _case(dtype, device, heads=4, kv_heads=2, dim=32, tokens=5, blocks=6, bs=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    rope = RotaryEmbedding(dim, 64, 10000.0, None)
    q = torch.randn(tokens, heads, dim, generator=g).to(dtype).to(device)
    k = torch.randn(tokens, kv_heads, dim, generator=g).to(dtype).to(device)
    v = torch.randn(tokens, kv_heads, dim, generator=g).to(dtype).to(device)
    pos = torch.tensor([0, 3, 17, 40, 63][:tokens], device=device)
    slots = torch.tensor([5, -1, 0, 13, 22][:tokens], device=device)  # one padding row
    caches = [
        torch.full((blocks, bs, kv_heads, dim), float("nan"), dtype=dtype, device=device)
        for _ in range(2)
    ]
    return rope, q, k, v, pos, slots, caches


@uses_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 2, 32), (3, 3, 16), (8, 1, 24)])
def test_the_kernel_matches_the_reference(dtype, heads, kv_heads, dim, device):
    rope, q, k, v, pos, slots, (kc, vc) = _case(dtype, device, heads, kv_heads, dim)
    cache = rope.cos_sin_cache.to(device)
    want_k, want_v = kc.clone(), vc.clone()
    want = reference.rope_store_ref(q, k, v, pos, cache, want_k, want_v, slots)
    q0, k0 = q.clone(), k.clone()
    got = rope_store(q, k, v, pos, cache, kc, vc, slots)
    rtol, atol = TOL[dtype]
    if dtype == torch.bfloat16 and device.type == "cpu":  # the interpreter truncates to bf16
        rtol, atol = 2e-2, 5e-2
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    torch.testing.assert_close(kc, want_k, rtol=rtol, atol=atol, equal_nan=True)
    assert torch.equal(vc.nan_to_num(7.0), want_v.nan_to_num(7.0))  # v is copied as it is
    assert torch.equal(q, q0) and torch.equal(k, k0)  # the inputs are left alone
    assert (
        kc.isnan().sum() == kc.numel() - 4 * kv_heads * dim
    )  # 4 slots written, not the padding row


def test_the_reference_is_the_rotary_layer_then_the_store():
    for dtype in (torch.float32, torch.bfloat16):
        rope, q, k, v, pos, slots, (kc, vc) = _case(dtype, torch.device("cpu"))
        want_q, want_k = rope(pos, q.reshape(5, -1), k.reshape(5, -1))
        wk, wv = kc.clone(), vc.clone()
        reference.store_kv_ref(want_k.reshape(k.shape), v, wk, wv, slots)
        got = reference.rope_store_ref(q, k, v, pos, rope.cos_sin_cache, kc, vc, slots)
        assert torch.equal(got, want_q.reshape(q.shape))
        assert torch.equal(kc.nan_to_num(7.0), wk.nan_to_num(7.0))
        assert torch.equal(vc.nan_to_num(7.0), wv.nan_to_num(7.0))
