"""A bounded soak (bench/soak.py) of a real daemon: cycles of mixed requests (SDK and
HTTP, streamed and not, aborts, clients that leave mid-stream, retunes, prefix hits
and misses, preemption in a small KV pool); after two warm-up cycles the memory the
daemon's Python holds must not climb with requests, and its descriptors and threads
must stay flat.

The bound compares cycles, never times. The daemon runs with PYTHONTRACEMALLOC=1 and
reports its traced bytes in /metrics, read after each cycle once it is idle: exact,
where RSS moves by megabytes with the allocator's free lists. Its SLO window is 2 s,
so the window's own minute of finishes does not read as growth.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_TRACED_SLOPE = 64  # bytes kept per request (tracemalloc), least squares over cycles 3..8


def _soak_module():
    spec = importlib.util.spec_from_file_location("bench_soak", ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_daemon_keeps_nothing_per_finished_request(tmp_path):
    soak = _soak_module()
    spec = soak.SoakSpec(requests=8 * 500, cycle=500, concurrency=32, slo_window=2.0, trace=True)
    samples = soak.soak(spec, tmp_path, progress=False)
    figures = soak.summary(samples, skip=2)
    failed = dict(figures["failures"])  # a str message: shown whole, not cut short
    assert figures["errors"] == 0, f"{figures['errors']} errors: {failed}"
    for kind in soak.KINDS:  # every kind of request ran in every cycle
        assert all(s.kinds[kind] > 0 for s in samples), (kind, [s.kinds for s in samples])
    assert len(figures["threads_after_warmup"]) == 1, figures
    fds = figures["fds_after_warmup"]
    assert max(fds) - min(fds) <= 1, figures
    traced = [s.traced for s in samples]
    assert figures["traced_bytes_per_request"] < MAX_TRACED_SLOPE, traced
    assert figures["objects_per_request"] < 0.5, [s.objects for s in samples]
