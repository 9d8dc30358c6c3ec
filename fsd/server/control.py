"""Answers each request type: submit, abort, retune, inject, jobs, status, drain, shutdown."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from fsd import protocol as P
from fsd.errors import ConfigError, UnknownJobError
from fsd.jobs import SamplingParams
from fsd.server.injector import ScenarioInjector
from fsd.server.telemetry import job_info

if TYPE_CHECKING:
    from fsd.server.service import EngineService

MAX_BURST = 10_000


class ControlHandler:
    """Turns decoded requests into engine calls and replies."""

    def __init__(self, service: EngineService) -> None:
        self.service = service
        self.engine = service.engine
        self._rng = random.Random(0)
        self.scenarios = ScenarioInjector(service)

    def dispatch(self, ident: bytes, msg: P.Request) -> None:
        handler = getattr(self, f"on_{type(msg).__name__.lower()}")
        handler(ident, msg)

    # ---- jobs ------------------------------------------------------------------

    def on_submit(self, ident: bytes, msg: P.Submit) -> None:
        svc = self.service
        if svc.draining:
            svc.send(
                ident,
                P.Error(
                    code="draining",
                    message="the daemon is draining; it accepts no new jobs",
                    req_id=msg.req_id,
                ),
            )
            return
        if (msg.prompt is None) == (msg.prompt_token_ids is None):
            raise ConfigError("give exactly one of prompt and prompt_token_ids")
        if msg.req_id in svc.clients[ident].jobs.values():
            raise ConfigError(f"req_id {msg.req_id!r} is already in flight on this connection")
        params = msg.sampling.params()
        prompt = msg.prompt if msg.prompt is not None else msg.prompt_token_ids
        job = self.engine.add_request(prompt, params, tags=msg.tags)
        svc.own(job.job_id, ident, msg.req_id)
        svc.send(
            ident,
            P.Accepted(
                req_id=msg.req_id,
                job_id=job.job_id,
                prompt_tokens=job.num_prompt_tokens,
                client_timeout=svc.cfg.client_timeout,
            ),
        )

    def on_abort(self, ident: bytes, msg: P.Abort) -> None:
        out = self.engine.abort(msg.job_id)  # UnknownJobError -> Error unknown-job
        self.service.finished(out)
        self.service.send(
            ident, P.Ack(what="abort", detail={"job_id": msg.job_id, "tokens": len(out.token_ids)})
        )

    def on_inject(self, ident: bytes, msg: P.Inject) -> None:
        if msg.scenario is not None:
            if msg.burst is not None:
                raise ConfigError("inject takes a burst or a scenario, not both")
            if self.service.draining:
                raise ConfigError("the daemon is draining; it accepts no new jobs")
            detail = self.scenarios.inject(msg.scenario, msg.tag, time.time())
            self.service.send(ident, P.Ack(what="inject", detail=detail))
            return
        if msg.burst is None:
            raise ConfigError("inject needs a burst (count, input_len, output_len) or a scenario")
        b = msg.burst
        if not 1 <= b.count <= MAX_BURST:
            raise ConfigError(f"burst count must be in [1, {MAX_BURST}], got {b.count}")
        if b.input_len < 1 or b.output_len < 1:
            raise ConfigError(f"burst lengths must be >= 1, got {b.input_len} and {b.output_len}")
        params = SamplingParams(max_tokens=b.output_len, ignore_eos=True)
        vocab = min(self.engine.loaded.arch.vocab_size, 256)
        ids = []
        for _ in range(b.count):
            prompt = [self._rng.randrange(1, vocab) for _ in range(b.input_len)]
            ids.append(self.engine.add_request(prompt, params, tags=[msg.tag]).job_id)
        self.service.send(ident, P.Ack(what="inject", detail={"job_ids": ids}))

    def on_listjobs(self, ident: bytes, msg: P.ListJobs) -> None:
        now = time.time()
        jobs = [job_info(j, now) for j in self.engine.scheduler.jobs()]
        self.service.send(ident, P.JobList(jobs=jobs))

    def on_getjob(self, ident: bytes, msg: P.GetJob) -> None:
        job = self.engine.scheduler.get(msg.job_id)
        if job is None:
            raise UnknownJobError(f"no job with id {msg.job_id!r}")
        self.service.send(ident, P.JobReply(job=job_info(job, time.time())))

    # ---- settings and life -----------------------------------------------------

    def on_retune(self, ident: bytes, msg: P.Retune) -> None:
        changes: dict[str, Any] = dict(msg.changes)
        if isinstance(changes.get("quanta"), list):
            changes["quanta"] = tuple(changes["quanta"])
        try:
            config = self.engine.retune(**changes)
        except (ConfigError, TypeError) as exc:
            self.service.send(ident, P.Error(code="invalid-setting", message=str(exc)))
            return
        self.service.send(ident, P.Ack(what="retune", detail={"config": config.to_dict()}))

    def on_status(self, ident: bytes, msg: P.Status) -> None:
        self.service.send(ident, self.service.status())

    def on_drain(self, ident: bytes, msg: P.Drain) -> None:
        self.service.begin_drain(ident, msg.timeout)

    def on_shutdown(self, ident: bytes, msg: P.Shutdown) -> None:
        self.service.send(ident, P.Ack(what="shutdown", detail={"drain": msg.drain}))
        self.service.begin_shutdown(msg.drain, msg.timeout)

    def on_ping(self, ident: bytes, msg: P.Ping) -> None:
        """Heartbeat: receiving it already refreshed the client's clock."""
