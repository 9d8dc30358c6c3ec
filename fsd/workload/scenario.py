"""Scenario files: a scripted workload that plays the same way live and in the simulator.

A scenario (TOML, documented in man/fsd-scenario.5) has a seed, a duration, phases
that run back to back unless given a `start` (an arrival process with a rate and CV, or a trace; a length
model) and timed events (a burst of jobs, a retune, abort-all). This module holds the
frozen model and the loader; `fsd.workload.timeline` expands a scenario into the
timed list of arrivals and actions that a player, the daemon or the simulator runs.

Every refusal is a `ConfigError` naming the file, the field and the value, e.g.
`steady.toml: phase[0].rate: must be > 0, got -1`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fsd.errors import ConfigError
from fsd.workload.scenario_fields import Fields, parse_lengths
from fsd.workload.trace import TraceRef

PHASE_ARRIVALS = ("poisson", "gamma", "uniform", "trace")
EVENT_KINDS = ("burst", "retune", "abort-all")
INLINE = "<inline>"


@dataclass(frozen=True)
class Phase:
    """A stretch of arrivals: a renewal process (rate may ramp linearly) or a trace window."""

    name: str
    start: float  # seconds from the scenario's start (phases may overlap)
    duration: float
    arrival: str  # poisson | gamma | uniform | trace
    rate: float = 1.0  # requests/s at the phase's start (not for traces)
    rate_end: float | None = None  # requests/s at its end: a linear ramp
    cv: float = 1.0
    lengths: Any = None  # a LengthModel (None for traces: the trace has lengths)
    trace: TraceRef | None = None
    trace_offset: float = 0.0  # seconds into the trace where the window starts
    rate_factor: float = 1.0  # the trace's time_scale; sweeps multiply it for every phase

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(frozen=True)
class BurstEvent:
    """`count` jobs arriving at `at` (spread evenly over `spread` seconds)."""

    at: float
    count: int
    prompt_len: int | None = None
    output_len: int | None = None
    lengths: Any = None  # a LengthModel instead of fixed lengths
    spread: float = 0.0


@dataclass(frozen=True)
class RetuneEvent:
    """Change scheduling settings at `at` (names as `fsctl retune` takes them)."""

    at: float
    changes: dict[str, Any]


@dataclass(frozen=True)
class AbortAll:
    """Abort, at `at`, every job of this scenario that is still running."""

    at: float


ScenarioEvent = BurstEvent | RetuneEvent | AbortAll


@dataclass(frozen=True)
class Scenario:
    """A parsed, validated scenario file."""

    name: str
    source: str  # the file it came from, or "<inline>"
    seed: int
    duration: float
    phases: tuple[Phase, ...]
    events: tuple[ScenarioEvent, ...] = ()
    description: str = ""
    time_scale: float = 1.0  # playback speed: 2 = every time halved (the same jobs)
    length_scale: float = 1.0  # token counts multiplied (small models, CPU runs)
    max_context: int | None = None
    max_output: int | None = None

    def scaled(self, time_scale: float = 1.0, length_scale: float = 1.0) -> Scenario:
        """Played `time_scale` times faster, with token counts times `length_scale`."""
        _positive(self.source, "time_scale", time_scale)
        _positive(self.source, "length_scale", length_scale)
        return replace(
            self,
            time_scale=self.time_scale * time_scale,
            length_scale=self.length_scale * length_scale,
        )

    def with_rate_factor(self, factor: float) -> Scenario:
        """Every phase's arrival rate times `factor` (events keep their times)."""
        _positive(self.source, "rate factor", factor)
        phases = tuple(
            replace(
                p,
                rate=p.rate * factor,
                rate_end=None if p.rate_end is None else p.rate_end * factor,
                rate_factor=p.rate_factor * factor,
            )
            for p in self.phases
        )
        return replace(self, phases=phases)

    def with_duration(self, duration: float) -> Scenario:
        """Cut to `duration` seconds (later phases and events dropped); or longer, with
        the phases that ran to the old end running to the new one."""
        _positive(self.source, "duration", duration)
        phases = []
        for p in self.phases:
            if p.start >= duration:
                continue
            end = duration if p.end >= self.duration - 1e-9 else min(p.end, duration)
            phases.append(replace(p, duration=end - p.start))
        events = tuple(e for e in self.events if e.at < duration)
        return replace(self, duration=duration, phases=tuple(phases), events=events)

    def describe(self) -> str:
        kinds = ", ".join(f"{p.name} ({p.arrival})" for p in self.phases)
        return f"{self.name}: {self.duration:g} s, phases {kinds}, {len(self.events)} events"


def _positive(source: str, name: str, value: float) -> None:
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{source}: {name}: must be > 0, got {value}")


# ---- loading ---------------------------------------------------------------------


def looks_inline(spec: str) -> bool:
    """TOML text rather than a path: it has a newline, a table header or an assignment."""
    return "\n" in spec or "=" in spec or spec.lstrip().startswith("[")


def bundle_scenario(
    path: str | Path, max_text: int | None = None, max_traces: int | None = None
) -> tuple[str, dict[str, str]]:
    """A scenario file and the traces it names, read here, to send inline.

    Returns (TOML text, {trace name as written in the file: CSV text}). The file is
    parsed first, so a bad scenario fails here, naming the file. `max_text` and
    `max_traces` cap the bytes (the daemon's limits: fsd.protocol).
    """
    scenario = load_scenario(Path(path))
    text = Path(path).expanduser().read_text()
    if max_text is not None and len(text.encode()) > max_text:
        raise ConfigError(f"scenario file {str(path)!r} is over {max_text} bytes")
    traces: dict[str, str] = {}
    for phase in scenario.phases:
        ref = phase.trace
        if ref is None or ref.name in traces or ref.path is None:
            continue
        try:
            traces[ref.name] = ref.path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"trace file {str(ref.path)!r} cannot be read: {exc}") from None
    size = sum(len(t.encode()) for t in traces.values())
    if max_traces is not None and size > max_traces:
        raise ConfigError(
            f"the traces of {str(path)!r} hold {size} bytes, over the {max_traces} bytes an "
            "inject may carry (cut the trace to the window the scenario plays)"
        )
    return text, traces


def load_scenario(spec: str | Path, base_dir: Path | None = None) -> Scenario:
    """A scenario from a file path or from inline TOML text (as `Inject` carries it).

    Relative trace paths resolve against the file's directory (inline: `base_dir`,
    default the working directory).
    """
    if isinstance(spec, str) and looks_inline(spec):
        return parse_scenario(spec, INLINE, base_dir or Path.cwd())
    path = Path(spec).expanduser()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"scenario file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"scenario file {str(path)!r} cannot be read: {exc}") from None
    return parse_scenario(text, str(path), path.resolve().parent, default_name=path.stem)


def parse_scenario(
    text: str,
    source: str,
    base_dir: Path | None,
    default_name: str = "scenario",
    traces: Mapping[str, str] | None = None,
) -> Scenario:
    """Validate TOML text into a `Scenario`; `source` names it in every error.

    Trace phases read files relative to `base_dir`, or, with `traces` (the daemon's
    case: `base_dir` None), take the text sent under their name and open nothing.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    top = Fields(doc, "", source)
    top.only("scenario", "phase", "event")
    head = top.table("scenario", required=True)
    head.only(
        "name",
        "description",
        "seed",
        "duration",
        "time_scale",
        "length_scale",
        "max_context",
        "max_output",
    )
    duration = head.number("duration", required=True, above=0)
    phases = _phases(top.tables("phase"), source, duration, base_dir, traces)
    events = tuple(
        sorted(
            (_event(t, duration) for t in top.tables("event")),
            key=lambda e: e.at,
        )
    )
    return Scenario(
        name=head.string("name", default=default_name),
        source=source,
        seed=int(head.number("seed", default=0, integer=True, at_least=0)),
        duration=duration,
        phases=phases,
        events=events,
        description=head.string("description", default=""),
        time_scale=head.number("time_scale", default=1.0, above=0),
        length_scale=head.number("length_scale", default=1.0, above=0),
        max_context=head.optional_int("max_context", at_least=2),
        max_output=head.optional_int("max_output", at_least=1),
    )


def _phases(
    phase_tables: list[Fields],
    source: str,
    duration: float,
    base_dir: Path | None,
    traces: Mapping[str, str] | None,
) -> tuple[Phase, ...]:
    """The `[[phase]]` tables in order, each starting where the one before ends unless
    it says when, all inside the scenario's `duration`."""
    if not phase_tables:
        raise ConfigError(f"{source}: phase: a scenario needs at least one [[phase]]")
    phases: list[Phase] = []
    start = 0.0
    for i, table in enumerate(phase_tables):
        start = table.number("start", default=start, at_least=0)
        if start >= duration:
            raise table.fail(
                "start",
                f"{start:g} s is not before the scenario's end ({duration:g} s); a phase "
                "without a duration runs to the end, so give the earlier phase one",
            )
        phase = _phase(table, i, start, duration - start, base_dir, traces)
        if phase.end > duration + 1e-9:
            raise table.fail(
                "duration",
                f"the phase ends at {phase.end:g} s, after the scenario's duration {duration:g} s",
            )
        phases.append(phase)
        start = phase.end
    return tuple(phases)


def _phase(
    t: Fields,
    i: int,
    start: float,
    rest: float,
    base_dir: Path | None,
    traces: Mapping[str, str] | None,
) -> Phase:
    t.only(
        "name",
        "start",
        "duration",
        "arrival",
        "rate",
        "rate_end",
        "cv",
        "lengths",
        "trace",
        "trace_offset",
        "time_scale",
    )
    arrival = t.choice("arrival", PHASE_ARRIVALS, default="poisson")
    duration = t.number("duration", default=rest, above=0)  # default: to the end
    name = t.string("name", default=f"phase{i}")
    if arrival == "trace":
        t.forbid(
            "rate", "rate_end", "cv", "lengths", why="a trace brings its own times and lengths"
        )
        path = t.string("trace", required=True)
        trace = _trace_ref(t, path, base_dir, traces)
        return Phase(
            name,
            start,
            duration,
            arrival,
            trace=trace,
            trace_offset=t.number("trace_offset", default=0.0, at_least=0),
            rate_factor=t.number("time_scale", default=1.0, above=0),
        )
    t.forbid("trace", "trace_offset", "time_scale", why=f"arrival {arrival!r} is not a trace")
    rate = t.number("rate", required=True, above=0)
    rate_end = t.number("rate_end", default=None, at_least=0)
    if arrival == "gamma":
        cv = t.number("cv", default=1.0, above=0)
    else:
        natural = 1.0 if arrival == "poisson" else 0.0
        cv = t.number("cv", default=natural)
        if cv != natural:
            raise ConfigError(
                f"{t.source}: {t.where('cv')}: a {arrival} process has cv {natural:g}, got "
                f'{cv:g} (use arrival = "gamma" for another cv)'
            )
    lengths = parse_lengths(t, "lengths", required=True)
    return Phase(name, start, duration, arrival, rate, rate_end, cv, lengths)


def _trace_ref(
    t: Fields, name: str, base_dir: Path | None, traces: Mapping[str, str] | None
) -> TraceRef:
    if traces is not None or base_dir is None:
        if traces is None or name not in traces:
            raise ConfigError(
                f"{t.source}: {t.where('trace')}: trace {name!r} was not sent with the "
                "scenario (fsctl inject --scenario FILE sends the traces the file names)"
            )
        return TraceRef(name, text=traces[name])
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if not path.is_file():
        raise ConfigError(
            f"{t.source}: {t.where('trace')}: trace file {name!r} does not exist "
            f"(looked at {str(path)!r})"
        )
    return TraceRef(name, path=path)


def _event(t: Fields, duration: float) -> ScenarioEvent:
    kind = t.choice("kind", EVENT_KINDS, required=True)
    at = t.number("at", required=True, at_least=0)
    if at >= duration:
        raise ConfigError(
            f"{t.source}: {t.where('at')}: {at:g} s is not before the scenario's end "
            f"({duration:g} s)"
        )
    if kind == "abort-all":
        t.only("kind", "at")
        return AbortAll(at)
    if kind == "retune":
        t.only("kind", "at", "set")
        changes = t.table("set", required=True).raw
        if not changes:
            raise ConfigError(f"{t.source}: {t.where('set')}: a retune needs at least one setting")
        return RetuneEvent(at, dict(changes))
    t.only("kind", "at", "count", "prompt_len", "output_len", "lengths", "spread")
    count = int(t.number("count", required=True, integer=True, at_least=1))
    if count > 100_000:
        raise ConfigError(f"{t.source}: {t.where('count')}: at most 100000 jobs, got {count}")
    spread = t.number("spread", default=0.0, at_least=0)
    if "lengths" in t.raw:
        t.forbid("prompt_len", "output_len", why="the burst takes its lengths from `lengths`")
        return BurstEvent(at, count, lengths=parse_lengths(t, "lengths"), spread=spread)
    prompt = int(t.number("prompt_len", required=True, integer=True, at_least=1))
    output = int(t.number("output_len", required=True, integer=True, at_least=1))
    return BurstEvent(at, count, prompt, output, spread=spread)
