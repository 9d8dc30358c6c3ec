"""The preview worker process's first act: take as little CPU from serving as it can.

`fsd.server.loop.preview` starts the twin in a spawned process with `setup_worker` as its
initializer. It asks numeric libraries for one thread (effective where numpy is not
loaded yet; a daemon run as `python -m fsd.cli` has its main module, and numpy with
it, imported into the child first, and then OpenBLAS's idle pool stays, unused by the
simulator's small arrays), then puts every thread of the process, those pools
included, in SCHED_IDLE (Linux's lowest CPU weight, below nice 19: a busy core
serves the daemon first; nice 19 where SCHED_IDLE is refused), and makes the process
die with the daemon. Measured by `bench/threads.py`: serving's tokens/s with a
preview running beside it. Nothing here imports numpy or torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
# thread pools a numeric library may start at import: one thread each
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def setup_worker() -> None:
    """In the worker: one BLAS thread, idle CPU priority, and end with the daemon."""
    # first tie its life to the daemon's (at idle priority on a busy machine, the steps
    # below could wait long enough for the daemon to die in between), then check that
    # the daemon did not die before the tie: an orphan's parent is init
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(0)
    for name in THREAD_ENV:
        os.environ[name] = "1"
    lower_priority()


def lower_priority() -> None:
    """SCHED_IDLE (else nice 19) for each thread of this process; threads started later
    inherit it. Per thread: on Linux both the policy and the nice value are a thread's."""
    try:
        tids = [int(p.name) for p in Path("/proc/self/task").iterdir()]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):  # not Linux, or refused: the weakest nice
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, 19)
