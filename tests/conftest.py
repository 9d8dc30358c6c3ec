"""Suite-wide setup.

Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors; the
variable must be set before anything imports triton, hence here at the top level.

No test may touch the user's own files: HOME points at a temporary folder for the
whole session (daemons, `fsd` processes and Ray inherit it), so a daemon started
without --state-dir writes its pidfile, log and operator token there, not in the
real ~/.local/state/fsd; the session fails if that folder gained files anyway.

Test files run in parallel (pytest-xdist, `--dist loadfile`: a file stays on one
worker, so a module's daemon starts once); `-p no:xdist` or `-n 0` runs them in one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# parallel workers share the CPUs: each takes its share of torch threads (an OpenMP
# thread spinning on a core another worker holds slows both), unless set already
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and not os.environ.get("OMP_NUM_THREADS"):
    _share = (
        max(1, len(os.sched_getaffinity(0)) // _WORKERS) if hasattr(os, "sched_getaffinity") else 1
    )
    os.environ["OMP_NUM_THREADS"] = str(_share)
    torch.set_num_threads(_share)

_HOME_VARS = ("HOME", "XDG_STATE_HOME")
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): the usable CPUs, at most MAX_WORKERS. Each worker
    loads torch and starts daemons; beyond a few the suite waits on its longest files."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, usable))


def _files(folder: Path) -> set[str]:
    try:
        return {p.name for p in folder.iterdir()}
    except OSError:
        return set()


@pytest.fixture(scope="session", autouse=True)
def private_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """HOME (and XDG_STATE_HOME) in a temporary folder for the whole session."""
    real_state = Path("~/.local/state/fsd").expanduser()
    before = _files(real_state)
    home = tmp_path_factory.mktemp("home")
    saved = {name: os.environ.get(name) for name in _HOME_VARS}
    os.environ["HOME"] = str(home)
    os.environ["XDG_STATE_HOME"] = str(home / ".local" / "state")
    try:
        yield home
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    added = _files(real_state) - before
    assert not added, f"tests wrote into the user's state dir {real_state}: {sorted(added)}"
