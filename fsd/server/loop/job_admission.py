"""The one way a job enters the engine: drain check, job caps, the engine's own
checks, then ownership.

Every job goes through `Admission.admit`: a ZeroMQ `Submit` (the HTTP API submits
over the same socket), an injected burst and each arrival of an injected scenario.
A batch is checked against the caps as a whole before any of it is admitted (a
burst either fits or is refused); the engine may still refuse a job on its own
(a prompt too long, a late job under refuse_late), and then the jobs before it stay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fsd.engine.face_protocol import Face
from fsd.engine.views import Admitted, JobRequest
from fsd.errors import FsdError
from fsd.jobs import SamplingParams
from fsd.server.loop.clients import ClientBook
from fsd.server.roles import Caller
from fsd.workload.prompts import random_prompt

BURST_VOCAB = 256  # synthetic prompts draw their ids below this (any model has them)


class DrainingError(FsdError):
    """The daemon is draining: it accepts no new jobs."""

    code: ClassVar[str] = "draining"


@dataclass(frozen=True)
class Ask:
    """One job to admit: what the engine takes, and the owner's name for it."""

    prompt: str | Sequence[int]
    params: SamplingParams
    tags: Sequence[str] = ()
    req_id: str | None = None  # the owner's name for the job (None: its job id)
    job_id: str | None = None  # a planned id (a scenario's); None: the engine picks
    arrival: float | None = None  # when it arrived (a scenario's due time); None: now
    affinity: str | None = None  # the router keeps one key's jobs together (fsd.cluster)


class Admission:
    """Admits jobs for their owners (module doc)."""

    def __init__(self, face: Face, book: ClientBook, draining: Callable[[], bool]) -> None:
        self.face = face
        self.book = book
        self.draining = draining

    def check_open(self) -> None:
        """Refuse (DrainingError) while the daemon drains."""
        if self.draining():
            raise DrainingError("the daemon is draining; it accepts no new jobs")

    def admit(
        self, owner: Caller, asks: Sequence[Ask], *, stream: bool = True, clip: bool = True
    ) -> list[Admitted]:
        """Admit `asks` for `owner` (streamed to it, or only finished); FsdError if
        refused. `clip` False: a max_tokens past the context is refused, not cut."""
        self.check_open()
        self.book.check_room(owner, len(asks), self.face.live())
        admitted = []
        for ask in asks:
            job = self.face.admit(
                JobRequest(
                    ask.prompt,
                    ask.params,
                    ask.job_id,
                    ask.arrival,
                    ask.tags,
                    clip,
                    ask.affinity,
                    owner.identity,
                )
            )
            self.book.own(job.job_id, owner, ask.req_id or job.job_id, stream)
            admitted.append(job)
        return admitted


def synthetic_ask(
    rng: np.random.Generator,
    vocab_size: int,
    prompt_len: int,
    output_len: int,
    tag: str,
    job_id: str | None = None,
    arrival: float | None = None,
) -> Ask:
    """A job of exact lengths: random prompt ids, `output_len` tokens with EOS ignored."""
    prompt = random_prompt(rng, prompt_len, min(vocab_size, BURST_VOCAB))
    params = SamplingParams(max_tokens=min(output_len, 2**31 - 1), ignore_eos=True)
    return Ask(prompt, params, (tag,), job_id=job_id, arrival=arrival)
