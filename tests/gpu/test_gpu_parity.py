"""fsd on CUDA against HuggingFace transformers on CUDA, in fp16 and bf16.

Each tiny fixture checkpoint (tests/models/hf_fixtures.py) is loaded by fsd on the GPU
in half precision with the engine's default attention backend ("auto": the Triton
kernels on CUDA) and by transformers twice on the GPU: in the same dtype, and in fp32
(the truth). Half precision is not exact, so each dtype has its own tolerance: fsd's
largest logit error against fp32 may be at most FACTOR x transformers' own error in
that dtype plus FLOOR[dtype], and never more than CAP[dtype]. Greedy tokens equal
transformers' fp32 greedy tokens up to the first near tie (a top-2 margin under
TIE[dtype] in fp32, where half precision may fairly pick the other token).

fsd runs through a NaN-filled paged cache the way the engine drives it (block size 4,
shuffled blocks): prompts, a chunk continuing a cached prefix, decodes and prefills in
one step, then batched decodes at ragged contexts.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from fsd.config import ModelConfig
from fsd.layers.attention import resolve_backend
from fsd.models.loader import LoadedModel, load_model
from tests.models.hf_fixtures import PagedRunner, make_llama_checkpoint, make_opt_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
FACTOR = 2.0
FLOOR = {torch.float16: 1e-2, torch.bfloat16: 6e-2}
CAP = {torch.float16: 0.1, torch.bfloat16: 0.5}
TIE = {torch.float16: 0.05, torch.bfloat16: 0.25}
VARIANTS = {
    "opt": ("opt", {}),
    "llama-gqa": ("llama", {}),
    "llama-mqa-headdim24": ("llama", {"num_key_value_heads": 1, "head_dim": 24}),
}


def CudaRunner(lm: LoadedModel, seed: int = 0) -> PagedRunner:  # noqa: N802 - a runner's maker
    """The engine's paged path on the GPU, through a NaN-filled cache."""
    return PagedRunner(lm, num_blocks=96, seed=seed, device="cuda", fill=float("nan"))


def _tokens(n: int, seed: int, vocab: int = 259) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def _hf(path: Any, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=dtype, attn_implementation="eager"
    )
    return model.to("cuda").eval()


def _hf_logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids], device="cuda")).logits[0].float()


@pytest.fixture(scope="module", params=list(VARIANTS))
def checkpoint(request, tmp_path_factory):
    pytest.importorskip("transformers")
    family, overrides = VARIANTS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    (make_opt_checkpoint if family == "opt" else make_llama_checkpoint)(path, **overrides)
    return path, _hf(path, torch.float32)


@pytest.fixture(params=list(DTYPES))
def dtype(request) -> torch.dtype:
    if DTYPES[request.param] == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    return DTYPES[request.param]


def _fsd(path: Any, dtype: torch.dtype) -> LoadedModel:
    name = str(dtype).removeprefix("torch.")
    lm = load_model(ModelConfig(model=str(path), device="cuda", dtype=name, attn_backend="auto"))
    assert lm.dtype == dtype and lm.device.type == "cuda"
    return lm


def _check(ours: torch.Tensor, ref: torch.Tensor, theirs: torch.Tensor, dtype, what: str) -> None:
    assert not torch.isnan(ours).any(), f"{what}: NaN in fsd's logits (a read past the context?)"
    err = float((ours - ref).abs().max())
    hf_err = float((theirs - ref).abs().max())
    bound = min(FACTOR * hf_err + FLOOR[dtype], CAP[dtype])
    assert err <= bound, (
        f"{what}: fsd {dtype} max |logit - fp32| {err:.3g}; transformers {dtype} {hf_err:.3g}; "
        f"bound {bound:.3g}"
    )


def test_the_engine_default_backend_on_cuda_is_triton():
    assert resolve_backend("auto", torch.device("cuda")) == "triton"


def test_logits_through_prefill_chunks_mixed_steps_and_decodes(checkpoint, dtype):
    path, hf32 = checkpoint
    seqs = {"a": _tokens(40, 1), "b": _tokens(31, 2), "c": _tokens(20, 3)}
    refs = {k: _hf_logits(hf32, v) for k, v in seqs.items()}
    assert min(r.std() for r in refs.values()) > 0.05  # the logits spread beyond the tolerance
    hf_half = _hf(path, dtype)
    theirs = {k: _hf_logits(hf_half, v) for k, v in seqs.items()}
    del hf_half
    runner = CudaRunner(_fsd(path, dtype), seed=7)
    a, b, c = seqs["a"], seqs["b"], seqs["c"]
    got: dict[str, list[torch.Tensor]] = {"a": [], "b": [], "c": []}
    # two prompts; then a decode, a chunk over b's cached prefix and a whole prompt together
    for name, out in zip("ab", runner.step([("a", a[:24]), ("b", b[:9])]), strict=True):
        got[name].append(out)
    step = runner.step([("a", [a[24]]), ("b", b[9:21]), ("c", c)])
    for name, out in zip("abc", step, strict=True):
        got[name].append(out)
    for i in range(15):  # a and b decode together at different contexts
        batch = [(n, [seqs[n][k]]) for n, k in (("a", 25 + i), ("b", 21 + i)) if k < len(seqs[n])]
        for (name, _), out in zip(batch, runner.step(batch), strict=True):
            got[name].append(out)
    for name, parts in got.items():
        ours = torch.cat(parts)
        assert ours.shape == refs[name].shape
        _check(ours, refs[name], theirs[name], dtype, f"sequence {name}")


def test_greedy_tokens_match_hf_fp32_up_to_a_near_tie(checkpoint, dtype):
    path, hf32 = checkpoint
    prompt, n = _tokens(12, 4), 10
    with torch.no_grad():
        out = hf32.generate(
            torch.tensor([prompt], device="cuda"), max_new_tokens=n, do_sample=False,
            pad_token_id=0, eos_token_id=None,
        )  # fmt: skip
    expected = out[0, len(prompt) :].tolist()
    runner = CudaRunner(_fsd(path, dtype), seed=3)
    (logits,) = runner.step([("g", prompt)])
    got = [int(logits[-1].argmax())]
    while len(got) < n:
        (logits,) = runner.step([("g", [got[-1]])])
        got.append(int(logits[-1].argmax()))
    for i, (ours, want) in enumerate(zip(got, expected, strict=True)):
        if ours != want:
            top = _hf_logits(hf32, prompt + expected[:i])[-1].topk(2).values
            margin = float(top[0] - top[1])
            assert margin < TIE[dtype], (
                f"token {i}: fsd {dtype} chose {ours}, fp32 {want} by a margin of {margin:.3g}"
            )
            break
