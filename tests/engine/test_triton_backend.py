"""The engine on the Triton kernels (the interpreter on CPU) equals the torch path."""

from __future__ import annotations

import importlib.util

import pytest

from fsd import LLM, SamplingParams

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)


def test_triton_attention_backend_generates_the_same_tokens_as_torch():
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40] * 19, [3]]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    kw = dict(num_gpu_blocks=16, block_size=4, max_batch_size=4, policy="fcfs")
    torch_out = LLM("tiny-opt", attn_backend="torch", **kw).generate(prompts, params)
    triton_out = LLM("tiny-opt", attn_backend="triton", **kw).generate(prompts, params)
    assert [o.token_ids for o in triton_out] == [o.token_ids for o in torch_out]
