"""What precision the Triton kernels compute in, seen at their launches.

Off CUDA (Triton's interpreter) the kernels upcast half-precision tiles to fp32 before
``tl.dot`` (``UPCAST``: the interpreter mis-multiplies bf16); on CUDA they must not: the
fp16/bf16 tiles go to the tensor cores as they are, which is the path the GPU tests
and benches have to exercise. A spy wrapped around each JIT kernel records the dtype
of the tensors it is handed and its compile-time constants, for a paged attention
layer step (store_kv, paged decode, paged prefill) in fp16 and bf16.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from fsd.layers.attention import AttentionMetadata, PagedAttention

uses_triton = pytest.mark.usefixtures("triton_ready")


class Spy:
    """Stands for a JIT kernel: `spy[grid](*args, **consts)` records, then launches."""

    def __init__(self, kernel: Any, name: str, log: list[dict]) -> None:
        self.kernel, self.name, self.log = kernel, name, log

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]

        def run(*args: Any, **kw: Any) -> Any:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            self.log.append({"kernel": self.name, "dtypes": [t.dtype for t in tensors], **kw})
            return launch(*args, **kw)

        return run


@pytest.fixture
def launches(monkeypatch) -> list[dict]:
    log: list[dict] = []
    decode = importlib.import_module("fsd.kernels.paged_decode")
    prefill = importlib.import_module("fsd.kernels.paged_prefill")
    store = importlib.import_module("fsd.kernels.store_kv")
    split, merge = decode._kernels()
    spied_decode = (Spy(split, "decode", log), Spy(merge, "merge", log))
    spied_prefill = Spy(prefill._kernel(), "prefill", log)
    spied_store = Spy(store._kernel(), "store_kv", log)
    monkeypatch.setattr(decode, "_kernels", lambda: spied_decode)
    monkeypatch.setattr(prefill, "_kernel", lambda: spied_prefill)
    monkeypatch.setattr(store, "_kernel", lambda: spied_store)
    return log


def _layer_step(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One attention-layer step with two decodes and a prefill over a cached prefix."""
    gen = torch.Generator().manual_seed(0)
    hq, hkv, dim, bs = 8, 2, 64, 16
    query_lens, context_lens = [1, 1, 20], [40, 17, 50]
    tables = [[3, 0, 5], [1, 6], [2, 4, 7, 8]]
    meta = AttentionMetadata.build(query_lens, context_lens, tables, bs, device=device)
    tokens = sum(query_lens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    cache = rand(2, 9, bs, hkv, dim)
    layer = PagedAttention(hq, hkv, dim, dim**-0.5, backend="triton")
    return layer(rand(tokens, hq * dim), rand(tokens, hkv * dim), rand(tokens, hkv * dim),
                 (cache[0], cache[1]), meta)  # fmt: skip


def _check(launches: list[dict], dtype: torch.dtype, device: torch.device) -> None:
    kinds = {entry["kernel"] for entry in launches}
    assert {"store_kv", "decode", "prefill"} <= kinds, kinds
    for entry in launches:
        if entry["kernel"] in ("decode", "prefill"):
            # q and the caches arrive in the model's dtype, nothing upcast on the way
            assert entry["dtypes"][:3] == [dtype] * 3, entry
            assert entry["UPCAST"] is (device.type != "cuda"), entry


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where CUDA is not")
@uses_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_off_cuda_the_interpreter_path_upcasts(dtype, launches) -> None:
    device = torch.device("cpu")
    out = _layer_step(device, dtype)
    assert out.dtype == dtype and not torch.isnan(out).any()
    _check(launches, dtype, device)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@uses_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_cuda_half_precision_reaches_the_tensor_cores(dtype, launches) -> None:
    device = torch.device("cuda")
    out = _layer_step(device, dtype)
    assert out.dtype == dtype and not torch.isnan(out).any()
    _check(launches, dtype, device)
