"""A planned copy of one job's KV between the device and host tiers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(eq=False)
class SwapOp:
    """Copy `src` blocks of one tier into `dst` blocks of the other, in every layer.

    `sync` ops (reactive swapping) complete before the model step that needs them;
    the others run beside it and end when the executor reports them done. The
    prefix cache's ops have no job: "out" / "in" move a cached block down or back,
    "copy" copies a device block into another (copy on write); all are `sync`.
    """

    job: Any
    direction: Literal["out", "in", "copy"]
    src: list[int]
    dst: list[int]
    sync: bool = False

    @property
    def num_blocks(self) -> int:
        return len(self.src)
