"""Expand a `Scenario` into a timeline: when each job arrives and when each action fires.

Arrivals of a phase come from its renewal process run in "operational time": unit-rate
gaps (the phase's CV) are laid out on Λ(t) = ∫ rate, then mapped back through Λ⁻¹,
so a linear ramp (`rate_end`) keeps the CV while the rate changes. A trace phase takes
the trace's requests in [trace_offset, trace_offset + duration). Bursts are arrivals
too; retunes and abort-all are actions. Everything is a pure function of the scenario
(seed per phase and per burst), so the player, the daemon and the simulator see the
same jobs. Times are then divided by the scenario's `time_scale`; token counts are
multiplied by `length_scale` and clipped to `max_context` / `max_output`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from fsd.workload.arrivals import ArrivalProcess
from fsd.workload.length_models import clip_lengths
from fsd.workload.scenario import AbortAll, BurstEvent, Phase, Scenario
from fsd.workload.spec import Workload
from fsd.workload.trace import read_trace


class Arrival(NamedTuple):
    """One job: when it arrives (s from the start), its token counts, where it came from."""

    time: float
    prompt_len: int
    output_len: int
    origin: str


@dataclass(frozen=True)
class Action:
    """A timed control action: `retune` (with `changes`) or `abort-all`."""

    time: float
    kind: str
    changes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Timeline:
    """Everything a scenario does, in time order."""

    name: str
    duration: float
    arrivals: tuple[Arrival, ...]
    actions: tuple[Action, ...] = ()

    def steps(self) -> list[tuple[float, Arrival | Action]]:
        """Arrivals and actions merged by time (an action first when times tie)."""
        items: list[tuple[float, int, int, Arrival | Action]] = [
            (a.time, 0, i, a) for i, a in enumerate(self.actions)
        ]
        items += [(a.time, 1, i, a) for i, a in enumerate(self.arrivals)]
        items.sort(key=lambda x: (x[0], x[1], x[2]))
        return [(t, item) for t, _, _, item in items]

    def workload(self) -> Workload:
        """The arrivals as a simulator workload (actions are not part of it)."""
        a = [x.time for x in self.arrivals]
        p = [x.prompt_len for x in self.arrivals]
        o = [x.output_len for x in self.arrivals]
        return Workload.from_arrays(a, p, o, source=self.name, params={"scenario": self.name})

    @property
    def rate(self) -> float:
        """Mean arrival rate over the duration (requests/s)."""
        return len(self.arrivals) / self.duration if self.duration > 0 else float("nan")


def expand(scenario: Scenario) -> Timeline:
    """The timeline of `scenario` (see the module doc)."""
    s = scenario
    arrivals: list[Arrival] = []
    for index, phase in enumerate(s.phases):
        rng = np.random.default_rng([s.seed, index])
        times, prompts, outputs = _phase_jobs(phase, rng)
        prompts, outputs = _shape(s, prompts, outputs)
        arrivals += [
            Arrival(phase.start + float(t), int(p), int(o), phase.name)
            for t, p, o in zip(times, prompts, outputs, strict=True)
        ]
    actions: list[Action] = []
    for index, event in enumerate(s.events):
        if isinstance(event, BurstEvent):
            rng = np.random.default_rng([s.seed, 1000 + index])
            prompts, outputs = _burst_lengths(event, rng)
            prompts, outputs = _shape(s, prompts, outputs)
            step = event.spread / event.count
            origin = f"burst@{event.at:g}s"
            arrivals += [
                Arrival(event.at + k * step, int(p), int(o), origin)
                for k, (p, o) in enumerate(zip(prompts, outputs, strict=True))
            ]
        elif isinstance(event, AbortAll):
            actions.append(Action(event.at, "abort-all"))
        else:
            actions.append(Action(event.at, "retune", dict(event.changes)))
    arrivals.sort(key=lambda a: a.time)  # stable: a phase's order holds at equal times
    k = s.time_scale
    return Timeline(
        s.name,
        s.duration / k,
        tuple(a._replace(time=a.time / k) for a in arrivals),
        tuple(Action(a.time / k, a.kind, a.changes) for a in actions),
    )


def _phase_jobs(phase: Phase, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    if phase.arrival == "trace":
        return _trace_window(phase)
    times = _renewal_times(phase, rng)
    prompts, outputs = phase.lengths.sample(len(times), rng)
    return times, prompts, outputs


def _renewal_times(phase: Phase, rng: np.random.Generator) -> np.ndarray:
    """Arrival offsets in [0, duration) of a (possibly ramped) renewal process."""
    r0 = phase.rate
    r1 = phase.rate if phase.rate_end is None else phase.rate_end
    d = phase.duration
    total = (r0 + r1) * d / 2  # Λ(d): expected arrivals
    unit = ArrivalProcess(phase.arrival, 1.0, phase.cv)
    chunk = max(16, int(total * 1.2) + 16)
    s = np.cumsum(unit.gaps(chunk, rng))
    while s.size and s[-1] < total:
        s = np.concatenate([s, s[-1] + np.cumsum(unit.gaps(chunk, rng))])
    s = s[s < total]
    # Λ(t) = r0 t + a t², a = (r1 - r0) / (2d); the stable root of a t² + r0 t - s = 0
    a = (r1 - r0) / (2 * d)
    root = np.sqrt(np.maximum(r0 * r0 + 4 * a * s, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(r0 + root > 0, 2 * s / (r0 + root), 0.0)
    return np.minimum(t, math.nextafter(d, 0.0))


def _trace_window(phase: Phase) -> tuple[np.ndarray, ...]:
    w = read_trace(phase.trace, time_scale=phase.rate_factor)  # type: ignore[arg-type]
    a, p, o = w.arrays()
    lo = phase.trace_offset / phase.rate_factor
    keep = (a >= lo) & (a < lo + phase.duration)
    return a[keep] - lo, p[keep], o[keep]


def _burst_lengths(b: BurstEvent, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if b.lengths is not None:
        return b.lengths.sample(b.count, rng)
    return np.full(b.count, b.prompt_len), np.full(b.count, b.output_len)


def _shape(s: Scenario, prompts: np.ndarray, outputs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Token counts times `length_scale` (at least 1), clipped to the scenario's bounds."""
    if s.length_scale != 1.0:
        prompts = np.maximum(1, np.rint(np.asarray(prompts) * s.length_scale)).astype(np.int64)
        outputs = np.maximum(1, np.rint(np.asarray(outputs) * s.length_scale)).astype(np.int64)
    return clip_lengths(prompts, outputs, s.max_context, s.max_output)
