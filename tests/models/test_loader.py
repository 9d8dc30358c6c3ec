"""The loader's error messages, presets, tokenizers and checkpoint formats."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fsd.config import ModelConfig
from fsd.errors import ConfigError, ModelLoadError
from fsd.layers.attention import AttentionMetadata
from fsd.models.hf_config import arch_from_hf_config
from fsd.models.loader import load_model
from fsd.models.presets import PRESETS, get_preset
from fsd.models.registry import build_model
from fsd.tokenizer import ByteTokenizer, HFTokenizer, IncrementalDetokenizer, Tokenizer
from tests.models.hf_fixtures import make_llama_checkpoint, make_opt_checkpoint


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return make_llama_checkpoint(tmp_path_factory.mktemp("llama"))


@pytest.fixture
def ckpt(llama_dir, tmp_path) -> Path:
    """A private copy of the tiny Llama checkpoint that a test may break."""
    return Path(shutil.copytree(llama_dir, tmp_path / "ckpt"))


def _load(model: str, **kw) -> object:
    return load_model(ModelConfig(model=model, device="cpu", **kw))


def _error(model: str | Path, *needles: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        _load(str(model))
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


def _logits(lm, ids: list[int]) -> torch.Tensor:
    a = lm.arch
    caches = [
        (
            torch.zeros(8, 4, a.num_kv_heads, a.head_dim),
            torch.zeros(8, 4, a.num_kv_heads, a.head_dim),
        )
        for _ in range(a.num_layers)
    ]
    meta = AttentionMetadata.build([len(ids)], [len(ids)], [[5, 2, 7, 0]], 4)
    with torch.inference_mode():
        hidden = lm.model(torch.tensor(ids), torch.arange(len(ids)), caches, meta)
        return lm.model.compute_logits(hidden)


# -- bad input ---------------------------------------------------------------------


def test_unknown_preset_lists_the_presets():
    _error("no-such-model", "no-such-model", "tiny", "opt-125m")


def test_hub_id_is_never_downloaded():
    _error("facebook/opt-125m", "facebook/opt-125m", "never downloads")


def test_missing_directory(tmp_path):
    _error(tmp_path / "nothing-here", "nothing-here", "does not exist")


def test_path_to_a_file(tmp_path):
    file = tmp_path / "weights.bin"
    file.write_bytes(b"x")
    _error(file, "is a file")


def test_directory_without_config(tmp_path):
    _error(tmp_path, "no config.json")


def test_malformed_config(ckpt):
    (ckpt / "config.json").write_text('{"model_type": "llama", ')
    _error(ckpt, "config.json", "not valid JSON")


def test_config_missing_key(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["hidden_size"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _error(ckpt, "config.json", "'hidden_size'")


def test_config_bad_value(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["num_attention_heads"] = "four"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _error(ckpt, "'num_attention_heads'", "'four'")


def test_unsupported_model_type(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    _error(ckpt, "unsupported model_type 'gpt2'", "opt, llama")


def test_missing_tokenizer(ckpt):
    (ckpt / "tokenizer.json").unlink()
    _error(ckpt, "tokenizer.json")


def test_no_weight_files(ckpt):
    (ckpt / "model.safetensors").unlink()
    _error(ckpt, "no weight files")


def test_corrupt_safetensors(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\x00\x01 definitely not safetensors")
    _error(ckpt, "cannot load weight file", "model.safetensors")


def test_corrupt_pytorch_bin(ckpt):
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"garbage")
    _error(ckpt, "cannot load weight file", "pytorch_model.bin")


def _rewrite_weights(ckpt: Path, edit: Callable[[dict], object]) -> None:
    tensors = load_file(str(ckpt / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(ckpt / "model.safetensors"))


def test_missing_weight_is_named(ckpt):
    _rewrite_weights(ckpt, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    _error(ckpt, "missing weights", "model.layers.1.self_attn.k_proj.weight")


def test_unexpected_weight_is_named(ckpt):
    _rewrite_weights(ckpt, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    _error(ckpt, "unexpected weight", "model.layers.0.extra.weight")


def test_misshapen_weight_is_named(ckpt):
    def edit(t):
        t["model.layers.0.mlp.up_proj.weight"] = torch.zeros(95, 64)

    _rewrite_weights(ckpt, edit)
    _error(ckpt, "model.layers.0.mlp.up_proj.weight", "(95, 64)")


def test_index_naming_a_missing_shard(ckpt):
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    _error(ckpt, "model-00002-of-00002.safetensors")


def test_max_model_len_beyond_positions():
    with pytest.raises(ConfigError, match="max_model_len"):
        _load("tiny-opt", max_model_len=4096)
    assert _load("tiny-opt", max_model_len=100).max_model_len == 100


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda():
    with pytest.raises(ConfigError, match="cuda"):
        load_model(ModelConfig(model="tiny-opt", device="cuda"))


# -- checkpoint formats ------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["bin", "sharded"])
def test_other_formats_load_the_same_weights(tmp_path, fmt):
    ref = make_opt_checkpoint(tmp_path / "ref", seed=3)
    if fmt == "bin":
        other = make_opt_checkpoint(tmp_path / fmt, seed=3, safe_serialization=False)
        assert (other / "pytorch_model.bin").is_file()
    else:
        other = make_opt_checkpoint(tmp_path / fmt, seed=3, max_shard_size="40KB")
        assert (other / "model.safetensors.index.json").is_file()
    assert not (other / "model.safetensors").exists()
    ids = [5, 9, 200, 31, 7]
    torch.testing.assert_close(_logits(_load(str(other)), ids), _logits(_load(str(ref)), ids))


def test_checkpoint_dtype_and_stop_ids(tmp_path):
    path = make_llama_checkpoint(tmp_path / "c", eos_token_id=[2, 0])
    lm = load_model(ModelConfig(model=str(path), device="cpu", dtype="bfloat16"))
    assert lm.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())
    assert lm.tokenizer.eos_token_ids[:2] == (2, 0)
    assert lm.arch.eos_token_ids == (2, 0)
    assert lm.source == str(path)


def test_v4_style_rope_config():
    cfg = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "max_position_embeddings": 1024,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },  # fmt: skip
        "torch_dtype": "bfloat16",
    }
    arch = arch_from_hf_config(cfg)
    assert arch.rope_theta == 500000.0
    assert arch.rope_scaling["rope_type"] == "llama3"
    assert arch.rope_scaling["original_max_position_embeddings"] == 1024
    assert arch.num_kv_heads == 4 and arch.head_dim == 16
    assert arch.checkpoint_dtype == "bfloat16"
    with pytest.raises(ModelLoadError, match="yarn"):
        arch_from_hf_config({**cfg, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})


# -- presets -----------------------------------------------------------------------


def _state(lm) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in lm.model.state_dict().items()}


def test_presets_are_seeded():
    a, b, c = (_state(_load("tiny", seed=s)) for s in (0, 0, 1))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["layers.0.self_attn.qkv_proj.weight"], c["layers.0.self_attn.qkv_proj.weight"]
    )
    assert torch.equal(a["norm.weight"], torch.ones_like(a["norm.weight"]))


def test_default_preset_is_tiny_and_runs():
    lm = load_model(ModelConfig(device="cpu"))
    assert lm.source == "preset:tiny" and lm.arch.family == "llama"
    assert lm.dtype == torch.float32 and lm.device.type == "cpu"
    assert isinstance(lm.tokenizer, ByteTokenizer) and isinstance(lm.tokenizer, Tokenizer)
    logits = _logits(lm, lm.tokenizer.encode("hi there"))
    assert logits.shape == (8, lm.arch.vocab_size) and torch.isfinite(logits).all()
    opt = _load("tiny-opt", dtype="float16")
    assert all(p.dtype == torch.float16 for p in opt.model.parameters())


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds(name):
    """Shapes only, on the meta device: the large presets allocate nothing."""
    arch = get_preset(name).arch
    assert arch.vocab_size == ByteTokenizer.VOCAB_SIZE
    with torch.device("meta"):
        model = build_model(arch)
    specs = model.weight_specs()
    assert sum(torch.Size(s.shape).numel() for s in specs) == sum(
        p.numel() for p in model.parameters()
    )


def test_preset_shapes():
    assert get_preset("opt-13b").arch.kv_bytes_per_token("float16") == 2 * 40 * 5120 * 2
    llama = get_preset("llama-1b").arch
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim) == (32, 8, 64)
    assert llama.kv_bytes_per_token(torch.float16, tp_size=2) == 2 * 16 * 4 * 64 * 2
    tiny = get_preset("tiny").arch
    assert (tiny.hidden_size, tiny.num_layers, tiny.num_heads, tiny.num_kv_heads) == (256, 4, 8, 4)
    with pytest.raises(ModelLoadError, match="tiny"):
        get_preset("huge")


# -- tokenizers --------------------------------------------------------------------

TEXTS = ["plain ascii", "héllo wörld", "日本語のテキスト", "emoji 🙂👍🏽 mix €", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode())
    assert tok.decode(ids) == text
    assert tok.decode([tok.BOS, *ids, tok.EOS]) == text
    assert tok.decode([tok.BOS, *ids], skip_special_tokens=False) == "<bos>" + text
    assert ByteTokenizer(add_bos=True).encode(text)[0] == tok.BOS
    assert tok.vocab_size % 64 == 0 and tok.eos_token_ids == (tok.EOS,)


def _stream(tok: Tokenizer, ids: list[int], prompt: Sequence[int] = ()) -> list[str]:
    det = IncrementalDetokenizer(tok, prompt_ids=prompt)
    chunks = [det.add(i) for i in ids]
    chunks.append(det.flush())
    assert "".join(chunks) == det.text
    return chunks


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_never_splits_characters(text):
    tok = ByteTokenizer()
    chunks = _stream(tok, tok.encode(text))
    assert "".join(chunks) == text
    assert not any("\ufffd" in c for c in chunks)
    # Tokens may also arrive several at a time.
    det = IncrementalDetokenizer(tok)
    ids = tok.encode(text)
    got = "".join(det.add(ids[i : i + 3]) for i in range(0, len(ids), 3)) + det.flush()
    assert got == text


def test_incremental_detokenizer_flushes_invalid_bytes():
    tok = ByteTokenizer()
    chunks = _stream(tok, [ord("a"), 0xE2, 0x82])  # a truncated "€"
    assert chunks[:3] == ["a", "", ""]
    assert chunks[3] == "\ufffd"


def test_hf_tokenizer_from_checkpoint(llama_dir):
    tok = HFTokenizer.from_dir(llama_dir)
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.vocab_size == 259
    for text in TEXTS[:4]:
        ids = tok.encode(text)
        assert ids[0] == 1 and tok.encode(text, add_special_tokens=False) == ids[1:]
        assert tok.decode(ids) == text
        prompt = tok.encode("prompt: ")
        chunks = _stream(tok, ids[1:], prompt=prompt)
        assert "".join(chunks) == text
        assert not any("\ufffd" in c for c in chunks)
