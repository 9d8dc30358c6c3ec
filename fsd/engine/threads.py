"""How many torch threads a CPU worker runs, and why: measured, not assumed.

torch starts with one intra-op thread per CPU it sees. Serving, those threads share
the cores with the daemon's own threads (the engine loop, the sockets' I/O threads,
KV copies, the preview twin) and with clients on the same machine, and an OpenMP
thread that spins on a taken core makes a step many times slower at random.
`bench/threads.py` measured 1 and 2 threads on 2 cores under load
(bench/results/threads-cpu.json): with 2, a 128-token stream and an inject burst ran
several times slower than with 1. So the default leaves one core to everything else:
the usable CPUs (affinity, cgroup quota) less one, at least one. `threads` in [model]
(`fsd start --threads`), OMP_NUM_THREADS, or a `torch.set_num_threads` before the
engine starts wins over the default. The worker logs the count and the reason.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

_HOW_TO_CHANGE = "set --threads (threads in [model]) or OMP_NUM_THREADS to change"


@dataclass(frozen=True)
class ThreadChoice:
    """The torch thread count a worker sets (None: leave torch's as it is) and why."""

    count: int | None
    reason: str

    def log_line(self, current: int) -> str:
        """The line the daemon logs at start (`current`: torch's count when unset here)."""
        return f"torch threads: {self.count or current} ({self.reason})"


def choose_threads(
    usable: int,
    configured: int | None = None,
    omp_env: str | None = None,
    torch_threads: int | None = None,
    seen: int | None = None,
) -> ThreadChoice:
    """The thread count for a CPU worker: pure, from what `pick_threads` reads.

    `usable`: CPUs this process may use (affinity and quota); `configured`: the config's
    `threads`; `omp_env`: OMP_NUM_THREADS; `torch_threads` and `seen`: torch's current
    count and the CPUs it saw (they differ when someone set the count before us).
    """
    if configured is not None:
        return ThreadChoice(configured, f"threads = {configured} in the config")
    if omp_env:
        return ThreadChoice(None, f"OMP_NUM_THREADS={omp_env}")
    if torch_threads is not None and seen is not None and torch_threads != seen:
        return ThreadChoice(None, "set with torch.set_num_threads before the engine started")
    cpus = f"{usable} usable CPU{'s' if usable != 1 else ''}"
    if usable <= 1:
        return ThreadChoice(1, f"{cpus}; {_HOW_TO_CHANGE}")
    why = "one left to the engine loop, sockets, KV copies and local clients"
    return ThreadChoice(usable - 1, f"{cpus}; {why}; {_HOW_TO_CHANGE}")


def _cgroup_cpus() -> float | None:
    """The cgroup CPU quota in CPUs (v2 cpu.max, else v1); None when unlimited or unknown."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        try:
            with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
                quota = f.read().strip()
            with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
                period = f.read().strip()
        except OSError:
            return None
    try:
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def affinity_cpus() -> int:
    """CPUs this process's affinity allows (what torch sizes its pool by)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup CPU quota."""
    cpus = affinity_cpus()
    quota = _cgroup_cpus()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def pick_threads(configured: int | None = None) -> ThreadChoice:
    """`choose_threads` for this process: reads the CPUs, the environment and torch."""
    import torch  # here: the choice itself stays importable without torch

    return choose_threads(
        usable_cpus(),
        configured,
        os.environ.get("OMP_NUM_THREADS"),
        torch.get_num_threads(),
        affinity_cpus(),
    )
