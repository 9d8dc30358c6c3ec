"""Hand-made cost models for tests: a few coefficients, so times can be added by hand."""

from __future__ import annotations

from fsd.cost import CostModel


def linear_cost(
    name: str,
    prefill: tuple[float, float],
    decode: tuple[float, float, float],
    **extra: float | int,
) -> CostModel:
    """prefill(n) = base + per_token * n; decode(b, C) = base + per_seq * b + per_ctx * C."""
    return CostModel(
        name=name,
        prefill_base=prefill[0],
        prefill_per_token=prefill[1],
        decode_base=decode[0],
        decode_per_seq=decode[1],
        decode_per_ctx_token=decode[2],
        **extra,  # type: ignore[arg-type]
    )
