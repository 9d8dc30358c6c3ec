"""The fused RMSNorm kernel against its reference, and the reference against the layer
it replaces: the sum is exact, the norm within two roundings of the input dtype (the
fp32 sum of squares may add up in another order)."""

from __future__ import annotations

import pytest
import torch

from fsd.kernels import reference, rms_norm
from fsd.layers.norm import RMSNorm

uses_triton = pytest.mark.usefixtures("triton_ready")
pytestmark = pytest.mark.gpu  # also run on the device machine (scripts/gpu-check.sh)
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 8e-3), torch.bfloat16: (2e-2, 5e-2)}


@uses_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 80, 256])
@pytest.mark.parametrize("with_residual", [False, True])
def test_the_kernel_matches_the_reference(device, dtype, hidden, with_residual):
    g = torch.Generator().manual_seed(hidden)
    x = (3 * torch.randn(5, hidden, generator=g)).to(dtype).to(device)
    res = torch.randn(5, hidden, generator=g).to(dtype).to(device) if with_residual else None
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).to(device)
    got, got_sum = rms_norm(x, w, 1e-6, res)
    want, want_sum = reference.rms_norm_ref(x, w, 1e-6, res)
    assert got.dtype == dtype and got.shape == x.shape
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    if with_residual and dtype == torch.bfloat16 and device.type == "cpu":
        # Triton's interpreter casts fp32 to bf16 by truncation, not to nearest
        torch.testing.assert_close(got_sum, want_sum, rtol=rtol, atol=atol)
    elif with_residual:
        assert torch.equal(got_sum, want_sum)  # the add rounds once, as torch's does
    else:
        assert got_sum is None and want_sum is None


@uses_triton
def test_strided_rows_and_no_rows(device):
    base = torch.randn(4, 96, device=device)
    x = base[:, :64]  # rows 96 apart
    w = torch.ones(64, device=device)
    got, _ = rms_norm(x, w, 1e-5)
    torch.testing.assert_close(got, reference.rms_norm_ref(x.contiguous(), w, 1e-5)[0])
    empty, total = rms_norm(base[:0, :64], w, 1e-5, base[:0, :64])
    assert empty.shape == (0, 64) and total is not None and total.shape == (0, 64)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(63, device=device), 1e-5)


def test_the_reference_is_the_layer_it_replaces():
    layer = RMSNorm(48, eps=1e-6)
    layer.weight.data = 1 + 0.1 * torch.randn(48)
    x, r = torch.randn(3, 48), torch.randn(3, 48)
    for dtype in (torch.float32, torch.bfloat16):
        layer = layer.to(dtype)
        xd, rd = x.to(dtype), r.to(dtype)
        assert torch.equal(
            reference.rms_norm_ref(xd, layer.weight, 1e-6)[0], RMSNorm.forward(layer, xd)
        )
        normed, total = reference.rms_norm_ref(xd, layer.weight, 1e-6, rd)
        assert torch.equal(total, xd + rd) and torch.equal(normed, RMSNorm.forward(layer, xd + rd))
