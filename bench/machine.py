"""What a benchmark ran on, written into every result JSON; how a result is written and
shown as a table; the options that the CPU timings share."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from rich.table import Table


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


def write_json(path: str | Path, result: dict) -> Path:
    """Write `result` as indented JSON (the folder is made if missing); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out


def write_result(path: str | Path, settings: dict, **fields: object) -> Path:
    """Write a benchmark's JSON: the machine (its CPU), the settings, then `fields`
    (the folder is made if missing); returns the path."""
    result = {"machine": describe_machine(torch.device("cpu")), "settings": settings, **fields}
    return write_json(path, result)


def table_of(title: str, columns: str, cells: str, rows: Iterable[dict], left: int = 0) -> Table:
    """A rich table of `rows`: `columns` names the columns and `cells` is each row's
    cells as `str.format` templates of its fields, both " | "-separated; the first
    `left` columns are left-aligned, the others right-aligned."""
    table = Table(title=title)
    for i, col in enumerate(columns.split(" | ")):
        table.add_column(col, justify="left" if i < left else "right")
    templates = cells.split(" | ")
    for r in rows:
        table.add_row(*(t.format(**r) for t in templates))
    return table


def timing_args(ap: argparse.ArgumentParser, batches: str) -> argparse.Namespace:
    """Parse a CPU timing's command line, with the options the timings share: --batches
    (comma-separated, default `batches`: a list of ints), --threads (torch's, set here)
    and --json (where the result goes)."""
    ap.add_argument("--batches", default=batches, type=lambda t: [int(b) for b in t.split(",")])
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", default=None, help="the result's path")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args
