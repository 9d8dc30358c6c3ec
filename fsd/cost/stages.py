"""How a model's layers split into pipeline stages: the one rule that the engine's
stages (`fsd.engine.stage`, `fsd.engine.ray_executor`) and the analytic profiles'
per-stage time (`fsd.cost.analytic`) share."""

from __future__ import annotations

from fsd.errors import ConfigError


def split_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per stage: even contiguous shares, the first `num_layers % pp` one more."""
    if not 1 <= pp <= num_layers:
        raise ConfigError(f"pp={pp} must be between 1 and the model's num_layers ({num_layers})")
    base, extra = divmod(num_layers, pp)
    return [base + (1 if s < extra else 0) for s in range(pp)]
