"""What a benchmark ran on, written into every result JSON, and how a result is written."""

from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path

import torch


def describe_machine(device: torch.device) -> dict:
    """CPU model and cores, GPU name and memory, library versions."""
    info = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device.type,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            pass
    return info


def machine_slug(device: torch.device) -> str:
    """A short file-name part: 'cpu' or the GPU's name."""
    if device.type != "cuda":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_result(path: str | Path, settings: dict, **fields: object) -> Path:
    """Write a benchmark's JSON: the machine (its CPU), the settings, then `fields`
    (the folder is made if missing); returns the path."""
    result = {"machine": describe_machine(torch.device("cpu")), "settings": settings, **fields}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out
