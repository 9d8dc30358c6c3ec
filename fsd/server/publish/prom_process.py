"""Prometheus gauges of the daemon process itself, read at scrape time: what a
long-running daemon holds (memory, descriptors, threads, Python's allocations), and
what its gates refused, dropped and hold for clients (`BudgetCounters`).

`process_*` follow the names of prometheus_client's own process collector (which a
private registry does not get); `fsd_python_*` count Python's small allocations and
tracked objects, and, when the daemon runs with PYTHONTRACEMALLOC=1, the bytes it
holds exactly: a daemon that keeps something per request shows there first, before
its RSS (bench/soak.py reads them after each cycle).
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_figures() -> dict[str, float]:
    """RSS, open descriptors, OS threads (Linux /proc; missing elsewhere) and Python's
    allocated blocks and GC-tracked objects of this process."""
    out: dict[str, float] = {
        "fsd_python_allocated_blocks": float(sys.getallocatedblocks()),
        "fsd_python_gc_objects": float(len(gc.get_objects())),
    }
    if tracemalloc.is_tracing():  # PYTHONTRACEMALLOC=1 in the daemon's environment
        out["fsd_python_traced_bytes"] = float(tracemalloc.get_traced_memory()[0])
    proc = Path("/proc/self")
    try:
        out["process_resident_memory_bytes"] = float(
            int((proc / "statm").read_text().split()[1]) * _PAGE
        )
        out["process_open_fds"] = float(sum(1 for _ in (proc / "fd").iterdir()))
        out["process_threads"] = float(sum(1 for _ in (proc / "task").iterdir()))
    except OSError:
        pass
    return out


_HELP = {
    "process_resident_memory_bytes": "Resident memory of the daemon process, in bytes.",
    "process_open_fds": "Open file descriptors of the daemon process.",
    "process_threads": "OS threads of the daemon process.",
    "fsd_python_allocated_blocks": "Python's allocated memory blocks (sys.getallocatedblocks).",
    "fsd_python_gc_objects": "Objects tracked by Python's garbage collector.",
    "fsd_python_traced_bytes": "Bytes Python allocated and holds (only with PYTHONTRACEMALLOC set).",
}


class ProcessGauges(Collector):
    """The gauges of `process_figures`, read at each scrape (labelled with the model
    name, as every fsd metric is)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        for name, value in process_figures().items():
            gauge = GaugeMetricFamily(name, _HELP[name], labels=["model_name"])
            gauge.add_metric([self.model_name], value)
            yield gauge


_BUDGET_HELP = {
    "fsd_inbound_held_bytes": "Bytes of client frames the gate passed on and the daemon has not read.",
    "fsd_inbound_refused_frames": "Client frames the gate refused: over max_inbound_bytes or max_frame_bytes.",
    "fsd_inbound_refused_bytes": "Bytes of the client frames the gate refused.",
    "fsd_inbound_settled_bytes": "Inbound bytes written off as discarded by libzmq (ledger drift).",
    "fsd_gate_dropped_connections": "Connections dropped for their unsent backlog, by endpoint.",
    "fsd_gate_backlog_bytes": "Bytes waiting to be sent to clients, by endpoint.",
    "fsd_gate_refused_connections": "Connections refused for want of a slot, by endpoint.",
    "fsd_gate_reclaimed_connections": "Idle or stuck connections closed for room, by endpoint.",
}
_BUDGET_COUNTERS = {"fsd_inbound_refused_frames", "fsd_inbound_refused_bytes",
                    "fsd_inbound_settled_bytes", "fsd_gate_dropped_connections",
                    "fsd_gate_refused_connections", "fsd_gate_reclaimed_connections"}  # fmt: skip


class BudgetCounters(Collector):
    """What the gates refused, dropped and hold (`fsd.server.transport.endpoints.budget_figures`),
    read at each scrape; a name `NAME:ENDPOINT` is NAME labelled with its endpoint."""

    def __init__(self, model_name: str, read: Callable[[], dict[str, float]]) -> None:
        self.model_name = model_name
        self.read = read

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for key, value in self.read().items():
            name, _, endpoint = key.partition(":")
            labels = ["model_name", "endpoint"] if endpoint else ["model_name"]
            family = families.get(name)
            if family is None:
                kind = CounterMetricFamily if name in _BUDGET_COUNTERS else GaugeMetricFamily
                family = families[name] = kind(name, _BUDGET_HELP[name], labels=labels)
            family.add_metric([self.model_name, endpoint] if endpoint else [self.model_name], value)
        yield from families.values()
