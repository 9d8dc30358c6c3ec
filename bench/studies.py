"""What the simulated studies (bench/policies.py, bench/distributed.py) share: their
common options, the metrics they keep of a run's row (fsd.sim.runner's), and the head
of the JSON they write."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import torch
from machine import describe_machine

from fsd.cost import CostModel
from fsd.sched.registry import DEFAULT_POLICY
from fsd.sched.slo import default_slo
from fsd.sim.capacity import max_context_of


def study_parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """A study's command line with --quick and --jobs; the study adds its own options."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    return ap


def keep(row: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The metrics of `names` that a run's row holds, in that order."""
    return {k: row[k] for k in names if k in row}


def study_result(bench: str, cost: CostModel, quick: bool, t0: float, **fields: Any) -> dict:
    """A study's JSON: the bench, the machine (its CPU), the profile with its SLO and
    context, the default policy, whether --quick, the seconds since `t0`; then `fields`."""
    return {
        "bench": bench,
        "machine": describe_machine(torch.device("cpu")),
        "profile": cost.name,
        "slo": default_slo(cost),
        "max_context": max_context_of(cost),
        "default_policy": DEFAULT_POLICY,
        "quick": quick,
        "wall_s": time.perf_counter() - t0,
        **fields,
    }
