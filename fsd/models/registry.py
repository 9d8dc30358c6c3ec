"""Model family name -> model class.

Every class takes `(arch: ModelArch, attn_backend: str = "auto")` and implements
the stage hooks `embed`, `decoder_layers` and `final_norm` plus `weight_specs`;
`forward`, `forward_stage`, `compute_logits`, `load_weights` and `init_random`
come from fsd.models.base.CausalLM.
"""

from __future__ import annotations

from fsd.errors import ModelLoadError
from fsd.models.arch import ModelArch
from fsd.models.base import CausalLM
from fsd.models.llama import LlamaForCausalLM
from fsd.models.opt import OPTForCausalLM

MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "opt": OPTForCausalLM,
    "llama": LlamaForCausalLM,
}


def model_class(family: str) -> type[CausalLM]:
    """The class for a family ("opt" | "llama"; Mistral and Qwen are "llama")."""
    try:
        return MODEL_CLASSES[family]
    except KeyError:
        raise ModelLoadError(
            f"no model class for family {family!r}; supported: {', '.join(MODEL_CLASSES)}"
        ) from None


def build_model(arch: ModelArch, attn_backend: str = "auto") -> CausalLM:
    """An uninitialised model of this architecture (load or init its weights next)."""
    return model_class(arch.family)(arch, attn_backend=attn_backend)
