"""The one way a job enters the engine: drain check, job caps, then the face admits
it (fsd.admission decides each), then ownership.

Every job goes through `Admission.admit`: a ZeroMQ `Submit` (the HTTP API submits
over the same socket), an injected burst and each arrival of an injected scenario.
A batch is checked against the caps as a whole before any of it is admitted (a
burst either fits or is refused); the engine may still refuse a job on its own
(a prompt too long, a late job under refuse_late), and then the jobs before it stay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from fsd.admission import JobRequest, check_open
from fsd.engine.face_protocol import Face
from fsd.engine.views import Admitted
from fsd.jobs import SamplingParams
from fsd.server.loop.clients import ClientBook
from fsd.server.roles import Caller
from fsd.workload.prompts import random_prompt

BURST_VOCAB = 256  # synthetic prompts draw their ids below this (any model has them)


class Admission:
    """Admits jobs for their owners (module doc)."""

    def __init__(self, face: Face, book: ClientBook, draining: Callable[[], bool]) -> None:
        self.face = face
        self.book = book
        self.draining = draining

    def check_open(self) -> None:
        """Refuse (DrainingError) while the daemon drains."""
        check_open(self.draining())

    def admit(
        self, owner: Caller, requests: Sequence[JobRequest], *, stream: bool = True
    ) -> list[Admitted]:
        """Admit `requests` for `owner` (streamed to it, or only finished); FsdError if
        refused (a draining daemon first)."""
        self.check_open()
        return self.take(owner, requests, stream=stream)

    def take(
        self, owner: Caller, requests: Sequence[JobRequest], *, stream: bool = True
    ) -> list[Admitted]:
        """`admit` once the drain was checked (a submit checks it before anything else)."""
        self.book.check_room(owner, len(requests), self.face.live())
        admitted = []
        for request in requests:
            job = self.face.admit(dataclasses.replace(request, owner=owner.identity))
            self.book.own(job.job_id, owner, request.req_id or job.job_id, stream)
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
) -> JobRequest:
    """A job of exact lengths: random prompt ids, `output_len` tokens with EOS ignored."""
    prompt = random_prompt(rng, prompt_len, min(vocab_size, BURST_VOCAB))
    params = SamplingParams(max_tokens=min(output_len, 2**31 - 1), ignore_eos=True)
    return JobRequest(prompt, params, job_id, arrival, (tag,))
