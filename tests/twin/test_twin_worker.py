"""The preview worker yields the CPU to serving: idle priority, one BLAS thread, set early."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import os, sys
from fsd.twin.worker import setup_worker
assert "numpy" not in sys.modules  # set before numpy starts its thread pool
setup_worker()
import numpy
idle = os.sched_getscheduler(0) == os.SCHED_IDLE or os.getpriority(os.PRIO_PROCESS, 0) == 19
print(idle, os.environ["OPENBLAS_NUM_THREADS"], os.environ["OMP_NUM_THREADS"])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux scheduling classes")
def test_the_worker_runs_at_idle_priority_with_one_blas_thread():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1", "1"]
