"""GPU checks (marked `gpu`, skipped without CUDA) and the CPU tests of the GPU tooling.

Like tests/kernels, the Triton kernels run in Triton's interpreter when there is no
GPU (tests/conftest.py sets TRITON_INTERPRET before anything imports Triton).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def triton_ready() -> None:
    """Skip without Triton."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
