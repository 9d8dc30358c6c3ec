"""What a benchmark ran on (the code lives in fsd.bench.machine, shared with `fsd bench`),
and how its result is written."""

import json
from pathlib import Path

import torch

from fsd.bench.machine import describe_machine, machine_slug

__all__ = ["describe_machine", "machine_slug", "write_result"]


def write_result(path: str | Path, settings: dict, **fields: object) -> Path:
    """Write a benchmark's JSON: the machine (its CPU), the settings, then `fields`
    (the folder is made if missing); returns the path."""
    result = {"machine": describe_machine(torch.device("cpu")), "settings": settings, **fields}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out
