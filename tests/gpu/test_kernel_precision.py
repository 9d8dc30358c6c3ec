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
    spies = {
        "paged_decode": ("decode", "merge"),
        "paged_prefill": ("prefill",),
        "store_kv": ("store_kv",),
    }
    for module_name, names in spies.items():
        module = importlib.import_module(f"fsd.kernels.{module_name}")
        spied = tuple(Spy(k, name, log) for k, name in zip(module._kernels(), names, strict=True))
        monkeypatch.setattr(module, "_kernels", lambda spied=spied: spied)
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


CUDA = torch.cuda.is_available()
DEVICES = [
    pytest.param(
        "cpu", marks=pytest.mark.skipif(CUDA, reason="the interpreter runs where CUDA is not")
    ),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA device")]
    ),
]


@uses_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("where", DEVICES)
def test_only_the_interpreter_path_upcasts(where: str, dtype, launches) -> None:
    """Off CUDA the tiles are upcast; on CUDA half precision reaches the tensor cores."""
    device = torch.device(where)
    out = _layer_step(device, dtype)
    assert out.dtype == dtype and not torch.isnan(out).any()
    _check(launches, dtype, device)
