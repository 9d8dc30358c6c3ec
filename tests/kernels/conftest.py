"""Kernel tests run the Triton kernels through Triton's CPU interpreter when there is no GPU.

``TRITON_INTERPRET`` is read when ``triton.language`` is imported (its own helpers such
as ``tl.max`` are wrapped then), so it has to be set before anything imports Triton;
``fsd.kernels`` itself imports Triton only on the first kernel call.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the kernel tests run: the GPU when there is one, else the CPU interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture(scope="session")
def triton_ready() -> None:
    """Skip without Triton; fail loudly if Triton was imported before interpreter mode."""
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    if HAS_CUDA:
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.standard.max, InterpretedFunction):
        pytest.fail(
            "triton was imported before TRITON_INTERPRET=1 was set; set it at the top of "
            "tests/conftest.py (or in the environment) when there is no GPU"
        )
