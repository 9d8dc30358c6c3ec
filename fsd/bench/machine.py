"""What a benchmark ran on, written into every result JSON."""

from __future__ import annotations

import os
import platform
import re

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
