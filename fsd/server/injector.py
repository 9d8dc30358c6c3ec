"""Scenario injection inside the daemon: validate once, then feed jobs over time.

`Inject(scenario=...)` carries a file path or inline TOML. The whole scenario is
checked before anything changes (its syntax, that every job fits this engine, that
every retune names valid settings); a refusal is one `ConfigError` naming the file,
field and value. An accepted scenario becomes a `Feed`; the service loop calls
`pump(now)` once per turn, which admits the arrivals that are due (tagged with the
Inject's tag), applies retunes and aborts the scenario's live jobs on abort-all.
Nothing here blocks: the loop's poll timeout is bounded by `next_due()`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from fsd.config import SchedConfig
from fsd.errors import ConfigError, FsdError, UnknownJobError
from fsd.jobs import SamplingParams
from fsd.sched.registry import resolve_policy
from fsd.workload.feed import Feed
from fsd.workload.scenario import load_scenario
from fsd.workload.timeline import Action, Timeline, expand

if TYPE_CHECKING:
    from fsd.engine.core import Engine
    from fsd.server.service import EngineService

log = logging.getLogger("fsd.server")


class ScenarioInjector:
    """The daemon's running scenario feeds."""

    def __init__(self, service: EngineService) -> None:
        self.service = service
        self.engine: Engine = service.engine
        self.feeds: list[tuple[Feed, np.random.Generator]] = []  # rng: the prompts' tokens
        self._count = 0

    def inject(self, spec: str, tag: str, now: float) -> dict[str, Any]:
        """Validate `spec` and start feeding it; the `Ack` detail (planned job ids...)."""
        scenario = load_scenario(spec)
        timeline = expand(scenario)
        check_fits(self.engine, timeline, scenario.source)
        for action in timeline.actions:
            if action.kind == "retune":
                check_retune(self.engine, action, scenario.source)
        self._count += 1
        feed = Feed(timeline, now, prefix=f"{tag}-s{self._count}-", tag=tag)
        self.feeds.append((feed, np.random.default_rng(self._count)))
        log.info(
            "scenario %s (%s): %d jobs and %d actions over %.1f s, tag %s",
            scenario.name,
            scenario.source,
            len(timeline.arrivals),
            len(timeline.actions),
            timeline.duration,
            tag,
        )
        return {
            "job_ids": feed.job_ids,
            "scenario": scenario.name,
            "duration": timeline.duration,
            "actions": len(timeline.actions),
        }

    def next_due(self) -> float | None:
        """Wall time of the earliest pending step of any feed."""
        times = [t for f, _ in self.feeds if (t := f.next_time()) is not None]
        return min(times) if times else None

    def pump(self, now: float) -> None:
        """Take every step that is due; drop all feeds once the daemon drains."""
        if not self.feeds:
            return
        if self.service.draining:
            for feed, _ in self.feeds:
                log.info("draining: %d steps of scenario %s dropped", feed.pending, feed.prefix)
            self.feeds = []
            return
        keep = []
        for feed, rng in self.feeds:
            try:
                for when, job_id, step in feed.due(now):
                    if isinstance(step, Action):
                        self._act(feed, step)
                    else:
                        self._admit(feed, job_id, step.prompt_len, step.output_len, when, rng)
            except Exception:  # noqa: BLE001 - a scenario must never stop the daemon
                log.exception("scenario %s failed; its remaining steps are dropped", feed.prefix)
                continue
            if not feed.done:
                keep.append((feed, rng))
        self.feeds = keep

    def _admit(
        self,
        feed: Feed,
        job_id: str | None,
        prompt_len: int,
        output_len: int,
        when: float,
        rng: np.random.Generator,
    ) -> None:
        vocab = min(self.engine.loaded.arch.vocab_size, 256)
        prompt = rng.integers(1, vocab, prompt_len).tolist()
        params = SamplingParams(max_tokens=output_len, ignore_eos=True)
        try:
            self.engine.add_request(
                prompt, params, request_id=job_id, arrival_time=when, tags=[feed.tag]
            )
        except FsdError as exc:  # checked up front; a retune may have changed limits since
            log.warning("scenario job %s not admitted: %s", job_id, exc)

    def _act(self, feed: Feed, action: Action) -> None:
        if action.kind == "retune":
            try:
                self.engine.retune(**_plain_changes(action.changes))
            except (ConfigError, TypeError) as exc:
                log.warning("scenario retune %s refused: %s", action.changes, exc)
            return
        aborted = 0
        for job_id in feed.started_ids():
            if self.engine.scheduler.get(job_id) is None:
                continue  # finished already
            try:
                self.service.finished(self.engine.abort(job_id))
                aborted += 1
            except UnknownJobError:
                pass
        log.info("scenario abort-all: %d jobs of %s aborted", aborted, feed.prefix)


def check_fits(engine: Engine, timeline: Timeline, source: str) -> None:
    """Refuse a scenario with a job this engine could never run (named with its origin)."""
    ctx = engine.max_model_len
    tokens = engine.config.sched.max_batch_tokens
    device = engine.blocks.device.num_blocks
    for k, a in enumerate(timeline.arrivals):
        where = f"{source}: {a.origin}: job {k} (prompt {a.prompt_len}, output {a.output_len})"
        if a.prompt_len >= ctx:
            raise ConfigError(f"{where}: the prompt does not fit the model's {ctx}-token context")
        if a.prompt_len > tokens:
            raise ConfigError(f"{where}: the prompt exceeds max_batch_tokens ({tokens})")
        need = engine.blocks.blocks_for(a.prompt_len + min(a.output_len, ctx - a.prompt_len))
        if need > device:
            raise ConfigError(
                f"{where}: needs {need} KV blocks, the device pool has {device} "
                "(lower max_context or length_scale in the scenario)"
            )


def check_retune(engine: Engine, action: Action, source: str) -> None:
    """Validate a retune's settings the way `Engine.retune` will, without applying them."""
    where = f"{source}: retune at {action.time:g} s"
    changes = _plain_changes(action.changes)
    sched_fields = {f.name for f in dataclasses.fields(SchedConfig)} - {"profile"}
    allowed = sched_fields | set(engine.RETUNABLE_CACHE)
    for key in changes:
        if key not in allowed:
            raise ConfigError(
                f"{where}: set.{key}: not a retunable setting (valid: {', '.join(sorted(allowed))})"
            )
    sched_kw = {k: v for k, v in changes.items() if k in sched_fields}
    cache_kw = {k: v for k, v in changes.items() if k not in sched_fields}
    try:
        sched = dataclasses.replace(engine.config.sched, **sched_kw)
        dataclasses.replace(engine.config.cache, **cache_kw)
        if resolve_policy(sched.policy) == "srpt":
            raise ConfigError("policy 'srpt' runs in the simulator only")
    except (ConfigError, TypeError) as exc:
        raise ConfigError(f"{where}: set: {exc}") from None


def _plain_changes(changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(changes)
    if isinstance(out.get("quanta"), list):
        out["quanta"] = tuple(out["quanta"])
    return out
