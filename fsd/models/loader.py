"""Build the model a `ModelConfig` names: a preset, or a local HuggingFace directory.

Nothing is ever downloaded. Every failure is a ModelLoadError (or ConfigError for
an impossible setting) whose message names the file or key at fault.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fsd.config import ModelConfig
from fsd.errors import ConfigError, ModelLoadError
from fsd.models.arch import ModelArch, dtype_from_name
from fsd.models.base import CausalLM
from fsd.models.hf_config import arch_from_hf_config
from fsd.models.presets import PRESETS
from fsd.models.registry import build_model
from fsd.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

_NO_DOWNLOAD = "fsd never downloads models: fetch it first (e.g. `huggingface-cli download`) and pass the directory"


@dataclass
class LoadedModel:
    """A model ready to run, with everything the engine needs to drive it."""

    model: CausalLM
    arch: ModelArch
    tokenizer: Tokenizer
    dtype: torch.dtype
    device: torch.device
    max_model_len: int
    source: str  # "preset:<name>" or the checkpoint directory

    @property
    def weight_bytes(self) -> int:
        """Bytes of this rank's parameters (tied weights counted once)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


@dataclass(frozen=True)
class ModelInfo:
    """What a model is, read without building it (the distributed driver needs no weights)."""

    arch: ModelArch
    tokenizer: Tokenizer
    dtype: torch.dtype
    device: torch.device
    max_model_len: int
    source: str  # "preset:<name>" or the checkpoint directory
    checkpoint: Path | None  # None for a preset (seeded random weights)

    def weights(
        self, seed: int, keep: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The full checkpoint tensors (those `keep` accepts, by name): read from the
        files, or a preset's seeded init (tensors not kept are never generated)."""
        if self.checkpoint is None:
            from fsd.models.base import random_weights

            with torch.device("meta"):  # specs only: no memory
                specs = build_model(self.arch, "torch").weight_specs()
            return random_weights([s for s in specs if keep is None or keep(s.name)], seed)
        tensors = iter_weights(weight_files(self.checkpoint))
        return tensors if keep is None else ((n, t) for n, t in tensors if keep(n))


def describe_model(cfg: ModelConfig, device: torch.device | None = None) -> ModelInfo:
    """Architecture, tokenizer, dtype and limits of `cfg.model`; no weights are read.

    `device`: where the weights will live (default: resolved from cfg.device); it
    decides what dtype "auto" means.
    """
    device = device or resolve_device(cfg.device)
    if cfg.model in PRESETS:
        arch = PRESETS[cfg.model].arch
        dtype = resolve_dtype(cfg.dtype, device, None)
        tokenizer: Tokenizer = ByteTokenizer()
        return ModelInfo(
            arch, tokenizer, dtype, device, _max_model_len(cfg, arch), f"preset:{cfg.model}", None
        )
    path = _checkpoint_dir(cfg.model)
    arch = _read_arch(path)
    max_len = _max_model_len(cfg, arch)
    tokenizer = HFTokenizer.from_dir(path)
    weight_files(path)  # fail here, before any worker starts, when there are none
    dtype = resolve_dtype(cfg.dtype, device, arch.checkpoint_dtype)
    return ModelInfo(arch, tokenizer, dtype, device, max_len, str(path), path)


def load_model(cfg: ModelConfig) -> LoadedModel:
    """Build and fill the model `cfg.model` names (preset name or checkpoint directory)."""
    info = describe_model(cfg)
    model = _build(info.arch, cfg.attn_backend, info.dtype, info.device)
    if info.checkpoint is None:
        model.init_random(cfg.seed)
    else:
        try:
            model.load_weights(iter_weights(weight_files(info.checkpoint)))
        except ModelLoadError as exc:
            raise ModelLoadError(f"{info.checkpoint}: {exc}") from None
    model.eval()
    return LoadedModel(
        model, info.arch, info.tokenizer, info.dtype, info.device, info.max_model_len, info.source
    )


def resolve_device(name: str) -> torch.device:
    """Resolve "auto" to cuda when available, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device 'cuda' was requested but no CUDA device is available")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, checkpoint_dtype: str | None) -> torch.dtype:
    """Resolve "auto": float32 on CPU; on CUDA the checkpoint's 16-bit dtype, else float16."""
    if name != "auto":
        return dtype_from_name(name)
    if device.type != "cuda":
        return torch.float32
    if checkpoint_dtype == "bfloat16" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float16


def _max_model_len(cfg: ModelConfig, arch: ModelArch) -> int:
    """The configured context, or the model's: its positions or, if shorter, its sliding
    window (fsd does not slide attention, so it serves no sequence beyond the window)."""
    if cfg.max_model_len is None:
        return arch.max_context
    if cfg.max_model_len > arch.max_position:
        raise ConfigError(
            f"max_model_len {cfg.max_model_len} exceeds the model's {arch.max_position} positions"
        )
    if cfg.max_model_len > arch.max_context:
        raise ConfigError(
            f"max_model_len {cfg.max_model_len} exceeds the {arch.sliding_window}-token sliding "
            f"window of this {arch.model_type} model: fsd does not implement sliding-window "
            "attention and serves such a model up to its window only"
        )
    return cfg.max_model_len


@contextmanager
def param_defaults(dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """Allocate parameters directly in their final dtype and device (no 2x peak)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def _build(
    arch: ModelArch, attn_backend: str, dtype: torch.dtype, device: torch.device
) -> CausalLM:
    with param_defaults(dtype, device):
        return build_model(arch, attn_backend)


def _checkpoint_dir(name: str) -> Path:
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelLoadError(f"model path {str(path)!r} is a file, not a checkpoint directory")
    presets = ", ".join(PRESETS)
    looks_like_path = name.startswith((".", "/", "~")) or "\\" in name
    if looks_like_path:
        raise ModelLoadError(f"checkpoint directory {name!r} does not exist")
    if "/" in name:
        raise ModelLoadError(
            f"model {name!r} is neither a preset ({presets}) nor a local directory; {_NO_DOWNLOAD}"
        )
    raise ModelLoadError(f"unknown model {name!r}: not a preset ({presets}) and no such directory")


def _read_arch(path: Path) -> ModelArch:
    file = path / "config.json"
    if not file.is_file():
        raise ModelLoadError(f"no config.json in {path}: not a HuggingFace checkpoint directory")
    config = _read_json(file)
    try:
        return arch_from_hf_config(config)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{file}: {exc}") from None


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{file} is not valid JSON: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read {file}: {exc}") from None


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's weight files: safetensors preferred, then pytorch_model*.bin."""
    for index_name, pattern in (
        ("model.safetensors.index.json", "*.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model*.bin"),
    ):
        index = path / index_name
        if index.is_file():
            return _indexed_files(index)
        files = sorted(path.glob(pattern))
        if files:
            return files
    raise ModelLoadError(
        f"no weight files in {path}: expected model.safetensors, sharded *.safetensors with "
        "model.safetensors.index.json, or pytorch_model.bin"
    )


def _indexed_files(index: Path) -> list[Path]:
    data = _read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index} has no 'weight_map'")
    files = [index.parent / str(name) for name in dict.fromkeys(weight_map.values())]
    for file in files:
        if not file.is_file():
            raise ModelLoadError(f"{index} lists {file.name}, which is not in {index.parent}")
    return files


def iter_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) for every tensor in the files, one file at a time."""
    for file in files:
        if file.suffix == ".safetensors":
            yield from _safetensors_weights(file)
        else:
            yield from _torch_weights(file)


def _safetensors_weights(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except Exception as exc:  # SafetensorError, OSError, ...
        raise ModelLoadError(f"cannot load weight file {file}: {exc}") from None
    with handle:
        for key in handle.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
            try:
                tensor = handle.get_tensor(key)
            except Exception as exc:
                raise ModelLoadError(
                    f"cannot read {key!r} from weight file {file}: {exc}"
                ) from None
            yield key, tensor


def _torch_weights(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:
        try:  # files from before torch's zip format cannot be memory-mapped
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ModelLoadError(f"cannot load weight file {file}: {exc}") from None
    except Exception as exc:
        raise ModelLoadError(f"cannot load weight file {file}: {exc}") from None
    if not isinstance(state, dict):
        raise ModelLoadError(f"weight file {file} does not hold a state dict")
    for key, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ModelLoadError(f"weight file {file}: entry {key!r} is not a tensor")
        yield str(key), tensor
